"""``higgsfield doctor``'s table, its problems in words, and the nodes active runs lost (:mod:`higgsfield.control.doctor.lost`)."""

from __future__ import annotations

from typing import Any

from higgsfield.control.cli._notes import merge_notes
from higgsfield.control.doctor import DoctorReport

__all__ = ["render_doctor", "render_lost"]


def render_doctor(out: Any, report: DoctorReport) -> None:
    from rich.markup import escape
    from rich.table import Table

    from higgsfield.control.doctor.report import CheckName

    table = Table(title="higgsfield doctor", title_justify="left")
    present = {c for n in report.nodes for c in n.checks}
    columns = [(c, _TITLES.get(c, c)) for c in CheckName.ALL if c not in _SLURM_COLUMNS or c in present]
    if CheckName.SLURM in present:  # a cluster's login node: no sudo, Docker or local GPUs to check
        columns = [(c, title) for c, title in columns if c not in _NOT_ON_A_LOGIN_NODE]
    table.add_column("node")
    for _, title in columns:
        table.add_column(title)
    for n in report.nodes:
        table.add_row(n.node, *(_cell(n.checks.get(c)) for c, _ in columns))
    out.print(table)
    problems = [(f"{name}: {p.problem}" + (f" -> fix: {p.fix}" if p.fix else ""), n.node, {"<node>": n.node})
                for n in report.nodes for name, p in n.checks.items() if not p.ok and p.problem]
    for text, where in merge_notes(problems):
        out.print(f"[bold red]✗[/] {escape(', '.join(where))}: {escape(text)}")
    if report.ok:
        out.print(f"[green]all {len(report.nodes)} node(s) look ready[/] ({report.seconds:.1f}s)")


_TITLES = {"gpus": "GPUs", "disk": "free disk", "usage": "disk usage"}   # else the check's name
_SLURM_COLUMNS = ("slurm", "partition", "account")        # a cluster's login node's only (CheckName's)
_NOT_ON_A_LOGIN_NODE = ("sudo", "docker", "gpus", "disk", "rendezvous")


def _cell(check: Any) -> str:
    if check is None:
        return "[dim]-[/]"
    style = "green" if check.ok else "bold red"
    return f"[{style}]{check.summary}[/]"


def render_lost(out: Any, lost: list[Any]) -> None:
    from rich.markup import escape

    from higgsfield.control.cli._status_table import fmt_time
    from higgsfield.control.doctor.lost import line

    for x in lost:
        out.print(f"[yellow]![/] {escape(line(x, fmt_time(x.at)))}")

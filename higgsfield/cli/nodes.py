"""``higgsfield setup`` and ``higgsfield doctor``: thin renderers over provision and doctor."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from higgsfield.cli._common import console, get_config

if TYPE_CHECKING:
    from rich.table import Table

    from higgsfield.doctor import DoctorReport
    from higgsfield.provision import SetupReport

def _console() -> Any:
    """The CLI console; when output is not a terminal (CI logs, pipes), wide enough for the tables."""
    out = console()
    if not out.is_terminal:
        out.width = max(out.width, 200)
    return out


STEP_NAMES = ("os", "docker", "docker-group", "nvidia", "invoker", "deploy-key", "base-image")
_STYLE = {"done": "green", "applied": "bold green", "skipped": "dim", "would apply": "yellow",
          "failed": "bold red", "not run": "dim red", "running": "cyan"}


@click.command()
@click.option("--dry-run", is_flag=True, help="Run only the read-only checks and print what would be applied.")
@click.option("--node", "nodes", multiple=True, metavar="NAME", help="Only this node (repeatable).")
@click.option("--step", "steps", multiple=True, type=click.Choice(STEP_NAMES), help="Only this step (repeatable).")
@click.option("--repin", multiple=True, metavar="NODE",
              help="Forget NODE's pinned host key and pin the one it offers now (after a deliberate rekey).")
@click.option("--deploy-key", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The deploy private key (default: the one 'higgsfield init' made).")
@click.option("--no-wheelhouse", is_flag=True,
              help="Let the nodes' pip fetch the invoker's dependencies from their index instead of sending them.")
@click.pass_context
def setup(ctx: click.Context, dry_run: bool, nodes: tuple[str, ...], steps: tuple[str, ...],
          repin: tuple[str, ...], deploy_key: Path | None, no_wheelhouse: bool) -> None:
    """Provision every node over SSH, concurrently: Docker, GPUs, the invoker, the deploy key.

    \b
    Steps (each checks first, so a re-run changes nothing):
      os, docker, docker-group, nvidia, invoker, deploy-key, base-image
    Exit code 0 only when every node is ready.
    """
    from higgsfield.errors import GroupError
    from higgsfield.provision import SetupOptions, provision, select_steps
    from higgsfield.provision.runner import CONNECT, select_nodes

    cfg = get_config(ctx)
    chosen_nodes = [str(n.name) for n in select_nodes(cfg, nodes)]
    chosen_steps = [CONNECT, *(s.name for s in select_steps(steps))]
    out = _console()
    state: dict[tuple[str, str], tuple[str, str]] = {}
    opts = SetupOptions(deploy_key=deploy_key, wheelhouse=not no_wheelhouse)

    def on_event(node: str, step: str, status: str, detail: str) -> None:
        state[(node, step)] = (status, detail)
        if live is not None:
            live.update(_progress_table(chosen_nodes, chosen_steps, state))
        elif status not in ("running", "not run") and (step != CONNECT or status == "failed"):
            out.print(f"{node}  {step}: {status}" + (f" ({detail})" if detail else ""))

    live = None
    if out.is_terminal:
        from rich.live import Live

        live = Live(_progress_table(chosen_nodes, chosen_steps, state), console=out, transient=True,
                    refresh_per_second=8)
    coro = provision(cfg, nodes=nodes or None, steps=steps or None, dry_run=dry_run, repin=repin,
                     options=opts, on_event=on_event)
    if live is not None:
        with live:
            report = asyncio.run(coro)
    else:
        report = asyncio.run(coro)
    _render_setup(out, report)
    if not report.ok:
        failed = sum(1 for n in report.nodes if not n.ok)
        raise GroupError(f"setup failed on {failed} of {len(report.nodes)} node(s): "
                         + "; ".join(f"{n.node}" for n in report.nodes if not n.ok), report)


def _progress_table(nodes: list[str], steps: list[str], state: dict[tuple[str, str], tuple[str, str]]) -> Table:
    from rich.table import Table

    table = Table(title="higgsfield setup", title_justify="left")
    table.add_column("node")
    for s in steps:
        table.add_column(s)
    for n in nodes:
        cells = []
        for s in steps:
            status, _ = state.get((n, s), ("", ""))
            label = "…" if status == "running" else status or "·"
            cells.append(f"[{_STYLE.get(status, 'dim')}]{label}[/]")
        table.add_row(n, *cells)
    return table


def _render_setup(out: Any, report: SetupReport) -> None:
    from rich.table import Table

    title = "setup plan (dry run: nothing changed)" if report.dry_run else "setup summary"
    table = Table(title=title, title_justify="left")
    table.add_column("node")
    table.add_column("host key")
    for step_name in report.steps:
        table.add_column(step_name)
    for n in report.nodes:
        key = "[bold red]unreachable[/]" if n.error else ("[yellow]pinned now[/]" if n.pinned_now else "verified")
        if n.fingerprint is None and not n.error:
            key = "local"
        cells = [f"[{_STYLE.get(r.outcome.value, '')}]{r.outcome.value}[/]" for r in n.steps]
        table.add_row(n.node, key, *cells)
    out.print(table)
    for n in report.nodes:
        if n.pinned_now:
            out.print(f"pinned {n.node}'s host key {n.fingerprint}: compare it with the node's "
                      "'ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub'")
    notes: dict[tuple[str, str], list[str]] = {}
    for n in report.nodes:
        for r in n.steps:
            if r.outcome.value in ("skipped", "applied", "would apply"):
                notes.setdefault((r.step, f"{r.outcome.value}: {r.detail}"), []).append(n.node)
    for (step, text), where in notes.items():
        who = "all nodes" if len(where) == len(report.nodes) > 1 else ", ".join(where)
        out.print(f"[dim]{step}[/] {text} [dim]({who})[/]")
    for line in report.failures():
        out.print(f"[bold red]✗[/] {line}")
    if report.ok:
        if report.dry_run:
            out.print(f"dry run: {len(report.nodes)} node(s) checked in {report.seconds:.1f}s")
        elif report.unchanged:
            out.print(f"[green]all {len(report.nodes)} node(s) ready: every step was already done, "
                      f"nothing changed[/] ({report.seconds:.1f}s)")
        else:
            out.print(f"[green]all {len(report.nodes)} node(s) ready[/] ({report.seconds:.1f}s)")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--node", "nodes", multiple=True, metavar="NAME", help="Only this node (repeatable).")
@click.pass_context
def doctor(ctx: click.Context, as_json: bool, nodes: tuple[str, ...]) -> None:
    """Read-only preflight of every node, in parallel: SSH, sudo, Docker, GPUs, disk, clock, invoker."""
    from higgsfield.doctor import diagnose
    from higgsfield.errors import GroupError

    cfg = get_config(ctx)
    report = asyncio.run(diagnose(cfg, nodes=nodes or None))
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    else:
        _render_doctor(_console(), report)
    if not report.ok:
        if as_json:
            sys.exit(1)
        raise GroupError(f"{len(report.problems())} problem(s) on "
                         f"{sum(1 for n in report.nodes if n.problems)} of {len(report.nodes)} node(s)", report)


def _render_doctor(out: Any, report: DoctorReport) -> None:
    from rich.table import Table

    table = Table(title="higgsfield doctor", title_justify="left")
    for col in ("node", "ssh", "host key", "sudo", "docker", "GPUs", "free disk", "clock", "invoker", "rendezvous"):
        table.add_column(col)
    for n in report.nodes:
        table.add_row(n.node, *(_cell(n.checks.get(c)) for c in
                                ("ssh", "host key", "sudo", "docker", "gpus", "disk", "clock", "invoker", "rendezvous")))
    out.print(table)
    for p in report.problems():
        out.print(f"[bold red]✗[/] {p}")
    if report.ok:
        out.print(f"[green]all {len(report.nodes)} node(s) look ready[/] ({report.seconds:.1f}s)")


def _cell(check: Any) -> str:
    if check is None:
        return "[dim]-[/]"
    style = "green" if check.ok else "bold red"
    return f"[{style}]{check.summary}[/]"

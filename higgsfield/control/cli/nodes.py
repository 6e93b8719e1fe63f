"""``higgsfield setup`` and ``higgsfield doctor``: thin renderers over provision and doctor."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from higgsfield.control.cli._common import console, get_config
from higgsfield.control.cli._notes import merge_notes

if TYPE_CHECKING:
    from rich.table import Table

    from higgsfield.control.provision import SetupReport

def _console() -> Any:
    """The CLI console; when output is not a terminal (CI logs, pipes), wide enough for the tables."""
    out = console()
    if not out.is_terminal:
        out.width = max(out.width, 200)
    return out


_STYLE = {"done": "green", "applied": "bold green", "skipped": "dim", "would apply": "yellow",
          "failed": "bold red", "not run": "dim red", "running": "cyan"}


class _ListsSteps(click.Command):
    """setup's help lists the steps where its text says ``{steps}``: named once, by provision's STEPS,
    which is imported only when the help is shown (``higgsfield --help`` never imports provision)."""

    def format_help_text(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if self.help and "{steps}" in self.help:
            from higgsfield.control.provision import STEPS

            self.help = self.help.replace("{steps}", ", ".join(s.name for s in STEPS))
        super().format_help_text(ctx, formatter)


@click.command(cls=_ListsSteps)
@click.option("--dry-run", is_flag=True, help="Run only the read-only checks and print what would be applied.")
@click.option("--node", "nodes", multiple=True, metavar="NODE",
              help="Only this node (its name, or its host when no other node shares it; repeatable).")
@click.option("--step", "steps", multiple=True, metavar="STEP", help="Only this step (repeatable; the steps are above).")
@click.option("--repin", multiple=True, metavar="NODE",
              help="Replace NODE's pinned host key with the one it offers now, after showing it and asking "
                   "(after a deliberate reinstall or rekey).")
@click.option("--accept-new-host-keys", is_flag=True,
              help="Pin the host keys of new (and --repin) nodes without asking: for automation that has "
                   "checked the fingerprints another way. Needed with no terminal, and under CI=true.")
@click.option("--deploy-key", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The deploy private key (default: the one 'higgsfield init' made).")
@click.option("--no-wheelhouse", is_flag=True,
              help="Let the nodes' pip fetch the invoker's dependencies from their index instead of sending them.")
@click.pass_context
def setup(ctx: click.Context, dry_run: bool, nodes: tuple[str, ...], steps: tuple[str, ...],
          repin: tuple[str, ...], accept_new_host_keys: bool, deploy_key: Path | None, no_wheelhouse: bool) -> None:
    """Provision every node over SSH, concurrently: Docker, GPUs, the invoker, the deploy key.

    \b
    Steps (each checks first, so a re-run changes nothing):
      {steps}
    Exit code 0 only when every node is ready.

    \b
    setup is the only command that trusts a new host: before anything is sent to a
    node whose host key is not pinned yet, it shows the key's fingerprint and asks
    once for all such nodes (--accept-new-host-keys for automation; under CI=true
    only that flag). Every other command refuses an unpinned or changed host key.
    """
    from higgsfield.contract.errors import GroupError
    from higgsfield.control.provision import SetupOptions, provision, select_steps, steps_for
    from higgsfield.control.provision.runner import CONNECT
    from higgsfield.control.provision.trust import scan_hosts
    from higgsfield.control.remote.fanout import select_nodes

    cfg = get_config(ctx)
    if cfg.slurm is not None:  # a Slurm cluster: its login node, the shared workdir as its state dir
        cfg = cfg.on_login_node()
    chosen_steps = [CONNECT, *(s.name for s in select_steps(steps, steps_for(cfg)))]  # unknown: one line, exit 2
    selected = select_nodes(cfg, names=nodes)
    chosen_nodes = [str(n.name) for n in selected]
    out = _console()
    scan = asyncio.run(scan_hosts(cfg, selected, repin))
    _confirm_host_keys(out, cfg, scan, accept_flag=accept_new_host_keys, dry_run=dry_run)
    state: dict[tuple[str, str], tuple[str, str]] = {}
    opts = SetupOptions(deploy_key=deploy_key, wheelhouse=not no_wheelhouse)

    def on_event(node: str, step: str, status: str, detail: str) -> None:
        state[(node, step)] = (status, detail)
        if live is not None:
            live.update(_progress_table(chosen_nodes, chosen_steps, state, dry_run))
        elif status not in ("running", "not run") and (step != CONNECT or status == "failed"):
            out.print(f"{node}  {step}: {status}" + (f" ({detail})" if detail else ""))

    live = None
    if out.is_terminal:
        from rich.live import Live

        live = Live(_progress_table(chosen_nodes, chosen_steps, state, dry_run), console=out, transient=True,
                    refresh_per_second=8)
    coro = provision(cfg, nodes=nodes or None, steps=steps or None, dry_run=dry_run, host_keys=scan,
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


def _confirm_host_keys(out: Any, cfg: Any, scan: Any, *, accept_flag: bool, dry_run: bool) -> None:
    """Show the new host keys and get the user's yes, before anything is sent to those nodes.

    Raises HostNotPinnedError (nothing pinned, nothing sent) when the answer is no, or
    when no one can be asked (no terminal, CI) and --accept-new-host-keys was not given.
    """
    from rich.markup import escape

    from higgsfield.control.provision.trust import consent, declined, known_hosts_shown, refusal

    for name in scan.unchanged:
        out.print(f"{escape(name)}: the host key it offers is the one already pinned: nothing to re-pin")
    if not scan.new:
        return
    path = known_hosts_shown(cfg)
    first = [k for k in scan.new if not k.replaces]
    repins = [k for k in scan.new if k.replaces]
    if first:
        out.print(f"{len(first)} node(s) are not pinned in {escape(path)} yet. Check each fingerprint against "
                  "the node's own (on the node: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub):")
        for k in first:
            out.print(f"  {escape(k.node)}  {escape(k.entry)}  {k.key_type}  [bold]{k.fingerprint}[/]")
    if repins:
        out.print("Re-pinning (--repin): the key pinned now will be replaced by the one the node offers:")
        for k in repins:
            out.print(f"  {escape(k.node)}  {escape(k.entry)}  {k.key_type}  [bold]{k.fingerprint}[/]  "
                      f"(pinned now: {', '.join(k.replaces)})")
    ci = os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")
    decision = consent(scan, accept_flag=accept_flag, interactive=bool(sys.stdin and sys.stdin.isatty()), ci=ci)
    if decision == "refuse":
        raise refusal(scan, ci=ci, path=path)
    what = "Trust these keys for this dry run (nothing is written)" if dry_run else \
        f"Trust and pin {'this key' if len(scan.new) == 1 else f'these {len(scan.new)} keys'}"
    if decision == "accept":
        out.print(f"{'trusted' if dry_run else 'pinning'} {len(scan.new)} host key(s): --accept-new-host-keys")
    elif not click.confirm(f"{what}?", default=False):
        raise declined(scan, path)


def _progress_table(nodes: list[str], steps: list[str], state: dict[tuple[str, str], tuple[str, str]],
                    dry_run: bool = False) -> Table:
    """The live view. Every column is as wide as the longest thing it can show from the start, so the
    table does not shift sideways as its cells fill."""
    from rich.table import Table

    labels = ["done", "applied", "skipped", "failed", "not run", *(["would apply"] if dry_run else [])]
    table = Table(title="higgsfield setup", title_justify="left")
    table.add_column("node", width=max(len(n) for n in [*nodes, "node"]), no_wrap=True)
    for s in steps:
        table.add_column(s, width=max(len(x) for x in [s, *labels]), no_wrap=True)
    for n in nodes:
        cells = []
        for s in steps:
            status, _ = state.get((n, s), ("", ""))
            label = "…" if status == "running" else status or "·"
            cells.append(f"[{_STYLE.get(status, 'dim')}]{label}[/]")
        table.add_row(n, *cells)
    return table


def _nodes_named(where: list[str], total: int) -> str:
    """``all nodes``, or the names, with runs of numbered names shortened (hfnode30..hfnode45)."""
    if len(where) == total > 1:
        return "all nodes"
    parts: list[str] = []
    run: list[tuple[str, int, str]] = []

    def flush() -> None:
        parts.extend([f"{run[0][2]}..{run[-1][2]}"] if len(run) >= 3 else [r[2] for r in run])
        run.clear()

    for name in where:
        m = re.fullmatch(r"(.*?)(\d+)", name)
        if m and run and run[-1][0] == m.group(1) and run[-1][1] + 1 == int(m.group(2)):
            run.append((m.group(1), int(m.group(2)), name))
            continue
        flush()
        run.append((m.group(1), int(m.group(2)), name) if m else ("\0", -2, name))
    flush()
    return ", ".join(parts)


def _render_setup(out: Any, report: SetupReport) -> None:
    from rich.markup import escape
    from rich.table import Table

    title = "setup plan (dry run: nothing changed)" if report.dry_run else "setup summary"
    table = Table(title=title, title_justify="left")
    table.add_column("node")
    table.add_column("host key")
    for step_name in report.steps:
        table.add_column(step_name)
    for n in report.nodes:
        key = "[bold red]unreachable[/]" if n.error else ("[yellow]pinned now[/]" if n.pinned_now else "verified")
        if n.pinned_now and report.dry_run:
            key = "[yellow]trusted (dry run)[/]"
        if n.fingerprint is None and not n.error:
            key = "local"
        cells = [f"[{_STYLE.get(r.outcome.value, '')}]{r.outcome.value}[/]" for r in n.steps]
        table.add_row(n.node, key, *cells)
    out.print(table)
    for n in report.nodes:
        if n.pinned_now:
            verb = "trusted (dry run, not pinned)" if report.dry_run else "pinned"
            out.print(f"{verb} {n.node}'s host key {n.fingerprint}")
    notes = [(f"{r.step}\0{r.outcome.value}: {r.detail}", n.node, {"<user>": n.user, "<node>": n.node})
             for n in report.nodes for r in n.steps if r.outcome.value in ("skipped", "applied", "would apply")]
    for text, where in merge_notes(notes):
        step, text = text.split("\0", 1)
        out.print(f"[dim]{escape(step)}[/] {escape(text)} [dim]({escape(_nodes_named(where, len(report.nodes)))})[/]")
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


def _model_size(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """``--model SIZE``: a parameter count as people write it, else one line, exit 2."""
    from higgsfield.contract.comm_cost import SIZE_FORMS, model_size
    from higgsfield.contract.text import shown

    if value is None:
        return None
    size = model_size(value)
    if size is None:
        raise click.BadParameter(f"{shown(value)} is not a model size: a number and k, m, b or t ({SIZE_FORMS})")
    return size


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--node", "nodes", multiple=True, metavar="NODE",
              help="Only this node (its name, or its host when no other node shares it; repeatable).")
@click.option("--fabric", is_flag=True,
              help="Benchmark the fabric: all-reduce 8 B..64 MiB, each node, each pair, the slow node named.")
@click.option("--nodes", "count", type=click.IntRange(min=2), default=None, metavar="K",
              help="With --fabric: the first K nodes.")
@click.option("--max-bytes", type=click.IntRange(min=8), default=None, hidden=True,
              help="With --fabric: the largest all-reduce message (default 64 MiB).")
@click.option("--model", default=None, metavar="SIZE", callback=_model_size,
              help="With --fabric: price a step of a model of SIZE parameters (125m, 1b, 7b) on the measured "
                   "link, in place of the project's experiments.")
@click.pass_context
def doctor(ctx: click.Context, as_json: bool, nodes: tuple[str, ...], fabric: bool, count: int | None,
           max_bytes: int | None, model: float | None) -> None:
    """Read-only preflight of every node, in parallel: SSH, sudo, Docker, GPUs, disk, clock, invoker, environment.

    With --fabric: a real collective benchmark over the nodes, started like a run."""
    from higgsfield.contract.codec import encode
    from higgsfield.contract.errors import GroupError
    from higgsfield.control.doctor import diagnose

    cfg = get_config(ctx)
    if fabric or count is not None or max_bytes is not None or model is not None:
        _doctor_fabric(ctx, cfg, as_json, nodes, fabric, count, max_bytes, model)
        return
    from higgsfield.control.doctor.lost import lost_nodes

    if cfg.slurm is not None:  # a Slurm cluster: its login node and Slurm's view of the partition
        cfg = cfg.on_login_node()
    report = asyncio.run(diagnose(cfg, nodes=nodes or None))
    lost = lost_nodes(report.runs, report)   # the nodes active runs lost (their survivors' records say so)
    if as_json:
        click.echo(json.dumps({**encode(report.as_json()), "lost": encode(lost)}, indent=2, sort_keys=True))
    else:
        from higgsfield.control.cli._doctor_table import render_doctor, render_lost

        render_doctor(_console(), report)
        render_lost(_console(), lost)
        if cfg.data:   # each data: entry's version per node, a node that differs named
            from higgsfield.control.backends.nodes.data.check import data_versions
            from higgsfield.control.cli.data import render_versions

            render_versions(*data_versions(cfg))
    if not report.ok:
        if as_json:
            sys.exit(1)
        raise GroupError(f"{len(report.problems())} problem(s) on "
                         f"{sum(1 for n in report.nodes if n.problems)} of {len(report.nodes)} node(s)", report)


def _doctor_fabric(ctx: click.Context, cfg: Any, as_json: bool, nodes: tuple[str, ...], fabric: bool,
                   count: int | None, max_bytes: int | None, model: float | None) -> None:
    """``doctor --fabric``: exit 1 when a node is slow or unhealthy, 2 on bad options."""
    from higgsfield.contract.codec import encode
    from higgsfield.contract.fabric import MAX_BYTES
    from higgsfield.control.cli._comm_table import render_comm
    from higgsfield.control.cli._fabric_table import render
    from higgsfield.control.doctor.comm_advice import project_rows
    from higgsfield.control.doctor.fabric import run_fabric

    if not fabric:
        raise click.UsageError("--nodes, --max-bytes and --model go with --fabric")
    if count is not None and nodes:
        raise click.UsageError("--nodes and --node: choose one")
    result = run_fabric(cfg, count, names=nodes, max_bytes=max_bytes or MAX_BYTES)
    rows, unknown, note = project_rows(cfg, result, model=model)
    if as_json:
        click.echo(json.dumps({**encode(result), "comm": encode(rows)}, indent=2, sort_keys=True))
    else:
        render(_console(), result)
        render_comm(_console(), rows, unknown, note)
    if result.outliers or result.unhealthy:
        sys.exit(1)

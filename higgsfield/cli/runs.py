"""``higgsfield run | logs | status | kill``: thin commands over :mod:`higgsfield.orchestrator`."""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import datetime
from typing import TYPE_CHECKING

import click

from higgsfield.cli._common import console, experiment_name, get_config, run_name
from higgsfield.text import shown

if TYPE_CHECKING:
    from rich.console import Console

    from higgsfield.config import Config
    from higgsfield.orchestrator import LogLine, RunStatus

_COLORS = ["cyan", "green", "magenta", "yellow", "blue", "bright_cyan", "bright_green", "bright_magenta"]
# C0 controls but tab, DEL, C1 controls: a node's log line must not drive the terminal (ANSI escapes, OSC, bell)
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
RECENT_FAILURES = 5   # status shows the error of the failed runs among the last this many
_STATE_STYLE = {"succeeded": "green", "failed": "red", "killed": "yellow", "running": "cyan",
                "starting": "cyan", "queued": "dim"}


def clean(text: str) -> str:
    """``text`` without control characters (tab kept): what a node sends is shown, never obeyed."""
    return _CONTROL.sub("", text)


def _print_lines(lines: object, *, color: bool) -> None:
    from higgsfield.orchestrator.runs import NOTICE

    out = sys.stdout
    for line in lines:  # type: ignore[attr-defined]
        ln: LogLine = line
        who = "higgsfield" if ln.rank == NOTICE else "launcher" if ln.rank < 0 else ln.rank
        tag = clean(f"{ln.node}/{who}")
        text = clean(ln.text)
        if color:
            code = 36 if ln.rank < 0 else 31 + (ln.rank % 6)
            out.write(f"\x1b[{code}m{tag}\x1b[0m | {text}\n")
        else:
            out.write(f"{tag} | {text}\n")
        out.flush()


def _follow(cfg: Config, status: RunStatus, *, follow: bool, node: str | None = None,
            ranks: tuple[int, ...] = (), since: float | None = None) -> None:
    from higgsfield.orchestrator import iter_logs
    from higgsfield.orchestrator.runs import LOST_AFTER_S

    _print_lines(iter_logs(cfg, status, follow=follow, node=node, ranks=ranks, since=since,
                           lost_after=LOST_AFTER_S if follow else None), color=sys.stdout.isatty())


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(value: str, now: float | None = None) -> float:
    """``--since``: ``30s``/``10m``/``2h``/``1d`` ago, or an ISO time (local unless it names a zone) -> UNIX time."""
    text = value.strip()
    m = _DURATION.fullmatch(text.lower())
    if m:
        ago = (time.time() if now is None else now) - float(m.group(1)) * _UNIT_S[m.group(2)]
        return ago if ago > 0 else 0.0   # "99999d" (or 1e400 s: -inf) means since the start
    try:
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise click.BadParameter(f"{shown(value)} is neither a duration ago (30s, 10m, 2h, 1d) "
                                 "nor a time (2026-11-30T10:00, local time)") from None
    try:
        return max(when.timestamp(), 0.0)  # a naive time is local time
    except (ValueError, OverflowError, OSError):
        # The platform cannot place it (0001-01-01): long before any log line, so every line.
        return 0.0


def _since_option(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    return None if value is None else parse_since(value)


@click.command()
@click.argument("experiment", callback=experiment_name)
@click.option("--param", "-p", "params", multiple=True, metavar="NAME=VALUE", help="A param value (repeatable).")
@click.option("--run-name", default=None, callback=run_name, help="Name of the run; default: EXPERIMENT-DATE-TIME-XXXX. "
              "Re-using a finished run's name resumes from its checkpoints.")
@click.option("--nodes", type=click.IntRange(min=1), default=None, help="Use the first K nodes of higgsfield.yml.")
@click.option("--max-restarts", type=click.IntRange(0, 1000), default=0, show_default=True,
              help="torchrun restarts of crashed workers (they resume from the last checkpoint).")
@click.option("--exclusive", is_flag=True, help="Take whole nodes (every GPU/slot), queueing until they are free.")
@click.option("--detach", "-d", is_flag=True, help="Start and return; follow with 'higgsfield logs RUN -f'.")
@click.pass_context
def run(ctx: click.Context, experiment: str, params: tuple[str, ...], run_name: str | None, nodes: int | None,
        max_restarts: int, exclusive: bool, detach: bool) -> None:
    """Run EXPERIMENT on the nodes and stream its logs until it ends (exit code = the run's).

    The nodes decide the run, with or without this command: a node whose part fails,
    or that is lost, fails it on every node within seconds; the first failure (node,
    rank, the last lines of its error) is shown at the end. A log stream this command
    loses is re-attached; the run goes on.
    """
    from higgsfield import orchestrator, secrets
    from higgsfield.params import parse_assignments

    cfg = get_config(ctx)
    given = parse_assignments(params)
    values = secrets.collect(cfg)
    err = console(stderr=True)
    handle = orchestrator.start_run(cfg, experiment, given, run_name=run_name, nodes=nodes,
                                    max_restarts=max_restarts, secrets=values, exclusive=exclusive)
    err.print(f"[bold]run[/] {handle.run} started on {', '.join(handle.nodes)}")
    if detach:
        err.print(f"follow: higgsfield logs {handle.run} -f    stop: higgsfield kill {handle.run}")
        click.echo(handle.run)
        return
    status = handle.status()
    try:
        _print_lines(orchestrator.follow_run(cfg, status), color=sys.stdout.isatty())
    except orchestrator.NodeLost as lost:  # the nodes decide the run: its final status below says how it ended
        err.print(f"{clean(str(lost))}", style="red", markup=False, highlight=False)
    except KeyboardInterrupt:
        err.print(f"\ndetached; run {handle.run} goes on.\n"
                  f"follow: higgsfield logs {handle.run} -f    stop: higgsfield kill {handle.run}")
        sys.exit(130)
    final = _wait_final(cfg, handle.run)
    style = _STATE_STYLE.get(final.state, "")
    extra = ""
    if final.failed_node:
        extra = f" (first failure: node {clean(final.failed_node)}" + (
            f", rank {final.failed_rank})" if final.failed_rank is not None else ")")
    err.print(f"run {handle.run} [{style}]{final.state}[/]{extra}")
    _print_failure(err, final)
    sys.exit(exit_code(final))


def exit_code(status: RunStatus) -> int:
    """``run``'s exit code: 0 when the run succeeded; else the failing node's (a signal N as 128+N), at least 1."""
    if status.state == "succeeded":
        return 0
    code = status.exit_code if status.state == "failed" else None
    if not code:
        return 1
    return min(255, 128 - code if code < 0 else code)


def _print_failure(out: Console, status: RunStatus, indent: str = "  ") -> None:
    """The first failure's reason and the last lines of its error (what a node sent is shown, never obeyed)."""
    if status.state != "failed":
        return
    if status.reason:
        out.print(f"{indent}{clean(status.reason)}", markup=False, highlight=False)
    for line in status.error_tail:
        out.print(f"{indent}| {clean(line)}", markup=False, highlight=False)


def _wait_final(cfg: Config, run_name: str, timeout: float = 30.0) -> RunStatus:
    from higgsfield.orchestrator import get_run

    deadline = time.time() + timeout
    status = get_run(cfg, run_name)
    while status.state in ("queued", "starting", "running") and time.time() < deadline:
        time.sleep(0.3)
        status = get_run(cfg, run_name)
    return status


@click.command()
@click.argument("target", metavar="EXPERIMENT|RUN", callback=run_name)
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the run ends.")
@click.option("--node", default=None, help="Only this node.")
@click.option("--rank", "ranks", type=click.IntRange(min=0), multiple=True, help="Only this global rank (repeatable).")
@click.option("--since", metavar="T", callback=_since_option,
              help="Only lines written since T: 30s, 10m, 2h, 1d ago, or a local time like 2026-11-30T10:00. "
                   "The launcher's log has no line times: shown whole if it changed since T, "
                   "else only what -f sees added.")
@click.pass_context
def logs(ctx: click.Context, target: str, follow: bool, node: str | None, ranks: tuple[int, ...],
         since: float | None) -> None:
    """Print the merged logs of a run (an experiment name means its latest run)."""
    from higgsfield.orchestrator import get_run

    cfg = get_config(ctx)
    status = get_run(cfg, target)
    try:
        _follow(cfg, status, follow=follow, node=node, ranks=ranks, since=since)
    except KeyboardInterrupt:
        sys.exit(130)


def _fmt_time(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _fmt_duration(d: float | None) -> str:
    if d is None:
        return "-"
    d = int(d)
    return f"{d // 3600}h{d % 3600 // 60:02d}m" if d >= 3600 else f"{d // 60}m{d % 60:02d}s"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """List runs on every node: state, nodes, start, duration, exit code, first failure."""
    from rich.table import Table

    from higgsfield.orchestrator import list_runs

    cfg = get_config(ctx)
    runs, results = list_runs(cfg)
    unreachable = [r for r in results if not r.ok]
    if as_json:
        click.echo(json.dumps({"runs": [r.to_dict() for r in runs],
                               "unreachable": {r.node: r.reason for r in unreachable}}, indent=2))
        return
    out = console()
    table = Table(box=None, pad_edge=False)
    for col in ("RUN", "EXPERIMENT", "STATE", "NODES", "STARTED", "DURATION", "EXIT", "FIRST FAILURE"):
        table.add_column(col)
    for r in runs:
        failure = f"{r.failed_node}" + (f" rank {r.failed_rank}" if r.failed_rank is not None else "") \
            if r.failed_node else ""
        style = _STATE_STYLE.get(r.state, "")
        table.add_row(r.run, r.experiment, f"[{style}]{r.state}[/]", ",".join(r.nodes), _fmt_time(r.started_at),
                      _fmt_duration(r.duration), "" if r.exit_code is None else str(r.exit_code), failure)
    if runs:
        out.print(table)
        for r in [r for r in runs[-RECENT_FAILURES:] if r.state == "failed"]:
            where = f"{r.failed_node}" + (f" rank {r.failed_rank}" if r.failed_rank is not None else "")
            out.print(f"\n{r.run}: first failure on {clean(where)}:", markup=False, highlight=False)
            _print_failure(out, r)
    else:
        out.print("no runs yet: start one with 'higgsfield run EXPERIMENT'")
    for u in unreachable:
        out.print(f"[red]{u.node}: unreachable: {u.reason}[/]")
    if unreachable:
        sys.exit(1)


@click.command()
@click.argument("target", metavar="EXPERIMENT|RUN", callback=run_name)
@click.pass_context
def kill(ctx: click.Context, target: str) -> None:
    """Stop a run (or every active run of an experiment) on every node."""
    from higgsfield.orchestrator import kill as _kill

    cfg = get_config(ctx)
    for r in _kill(cfg, target):
        click.echo(f"{r.run}: {r.state}")


@click.command()
@click.option("--dirty", is_flag=True, help="Include uncommitted changes (tracked and untracked, not ignored).")
@click.pass_context
def deploy(ctx: click.Context, dirty: bool) -> None:
    """Ship the project's committed code to every node and build its image there."""
    from higgsfield.orchestrator import deploy as _deploy

    cfg = get_config(ctx)
    result = _deploy(cfg, dirty=dirty, console=console(stderr=True))
    click.echo(f"deployed {result.commit[:12]} to {len(result.nodes)} node(s) in {result.seconds:.1f}s")

"""``higgsfield run | logs | status | kill | deploy | pull``: thin commands over the project's backend.

The backend (:func:`higgsfield.control.backends.select.backend_for`) is the SSH nodes, or the Slurm
cluster of a ``slurm:`` block; these commands never ask which (``pull`` goes through
:func:`higgsfield.control.backends.select.pull`, which picks the same way).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from higgsfield.contract.runspec import ON_STALL
from higgsfield.contract.stall_policy import DEFAULT_STALL
from higgsfield.contract.states import FAILED, KILLED, QUEUED, RUNNING, STALLED, STARTING, SUCCEEDED
from higgsfield.control.cli._common import console, experiment_name, get_config, preflight_exclude, run_name
from higgsfield.control.cli._lines import clean, print_stream, since_option

if TYPE_CHECKING:
    from rich.console import Console

    from higgsfield.control.backends import Backend, RunList
    from higgsfield.control.backends.nodes import RunHandle, RunStatus
    from higgsfield.control.config import Config

RECENT_FAILURES = 5   # status shows the error of the failed runs among the last this many
_STATE_STYLE = {SUCCEEDED: "green", FAILED: "red", KILLED: "yellow", RUNNING: "cyan", STARTING: "cyan", QUEUED: "dim",
                STALLED: "magenta"}


def _node_list(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...]:
    """``--exclude n1,n2``: the names, in order, without blanks or repeats."""
    if value is None:
        return ()
    names = tuple(dict.fromkeys(x.strip() for x in value.split(",") if x.strip()))
    if not names:
        raise click.BadParameter("name at least one node (NODE[,NODE])")
    return names


@click.command()
@click.argument("experiment", callback=experiment_name)
@click.option("--param", "-p", "params", multiple=True, metavar="NAME=VALUE", help="A param value (repeatable).")
@click.option("--run-name", default=None, callback=run_name, help="Name of the run; default: EXPERIMENT-DATE-TIME-XXXX. "
              "Re-using a finished run's name resumes from its checkpoints.")
@click.option("--nodes", type=click.IntRange(min=1), default=None,
              help="Use the first K nodes of higgsfield.yml (on Slurm: K nodes instead of slurm.nodes).")
@click.option("--time", "time_limit", default=None, metavar="LIMIT",
              help="Slurm: the job's time limit instead of slurm.time (90, 24:00:00, 2-00:00:00).")
@click.option("--partition", default=None, help="Slurm: the partition instead of slurm.partition.")
@click.option("--max-restarts", type=click.IntRange(0, 1000), default=0, show_default=True,
              help="Restarts of crashed workers, resuming from the last checkpoint (on Slurm: requeues).")
@click.option("--exclusive", is_flag=True, help="Take whole nodes (every GPU/slot), queueing until they are free.")
@click.option("--stall-timeout", type=click.FloatRange(min=0, max=1e9), default=None, metavar="SECONDS",
              help="Seconds without progress of any rank before the run counts as hung (0: never); "
                   f"default: stall_timeout in higgsfield.yml ({DEFAULT_STALL.stall_timeout:g}).")
@click.option("--startup-timeout", type=click.FloatRange(min=0, max=1e9), default=None, metavar="SECONDS",
              help="Seconds the run may take to its first progress (0: no limit); "
                   f"default: startup_timeout in higgsfield.yml ({DEFAULT_STALL.startup_timeout:g}).")
@click.option("--on-stall", type=click.Choice(ON_STALL), default=None,
              help="What a hung run does: fail it, restart its workers from the last checkpoint, or wait "
                   f"(shown 'stalled'); default: on_stall in higgsfield.yml ({DEFAULT_STALL.on_stall}).")
@click.option("--exclude", "exclude", default=None, metavar="NODE[,NODE]", callback=_node_list,
              help="Leave these nodes out (a name, or a host no other node shares; on Slurm: sbatch --exclude); "
                   "--nodes counts among the others.")
@click.option("--min-nodes", type=click.IntRange(min=1), default=None, metavar="N",
              help="Go on without a lost node (dead, frozen, cut off) while at least N nodes are left: the nodes "
                   "regroup by themselves and resume from the last checkpoint. Default: min_nodes in "
                   "higgsfield.yml, else every node (a loss fails).")
@click.option("--spares", type=click.IntRange(min=0), default=None, metavar="N",
              help="Nodes of higgsfield.yml after the run's that stand by, holding their slots: one takes a lost "
                   "node's place and the run goes on at its size (with --nodes K: the next N healthy ones). "
                   "Default: spares in higgsfield.yml (0).")
@click.option("--max-recoveries", type=click.IntRange(0, 1000), default=None, metavar="N",
              help="Lost nodes a run goes on after (with --min-nodes or --spares), 0: none; default: "
                   "max_recoveries in higgsfield.yml (3).")
@click.option("--allow-drift", is_flag=True, help="Run even when the nodes differ (driver, CUDA, NCCL, packages, "
              "Python, invoker, environment, GPUs): 'higgsfield doctor' lists the differences.")
@click.option("--preflight/--no-preflight", default=None, help="Test the fabric first (doctor --fabric); with "
              "--nodes K, a slow or failing node is passed over. Default: preflight in higgsfield.yml.")
@click.option("--detach", "-d", is_flag=True, help="Start and return; follow with 'higgsfield logs RUN -f'.")
@click.pass_context
def run(ctx: click.Context, experiment: str, params: tuple[str, ...], run_name: str | None, nodes: int | None,
        time_limit: str | None, partition: str | None, max_restarts: int, exclusive: bool,
        stall_timeout: float | None, startup_timeout: float | None, on_stall: str | None,
        exclude: tuple[str, ...], min_nodes: int | None, spares: int | None, max_recoveries: int | None,
        allow_drift: bool,
        preflight: bool | None, detach: bool) -> None:
    """Run EXPERIMENT on the nodes and stream its logs until it ends (exit code = the run's).

    The nodes decide the run, with or without this command: a node whose part fails,
    or that is lost, fails it on every node within seconds; the first failure (node,
    rank, the last lines of its error) is shown at the end. A log stream this command
    loses is re-attached; the run goes on. A run whose ranks stop progressing is found
    by the nodes too (--stall-timeout): the end then names the odd ranks and where they are.
    """
    from higgsfield.contract.params import parse_assignments
    from higgsfield.control import secrets
    from higgsfield.control.backends import RunRequest, backend_for
    from higgsfield.control.doctor.comm_advice import plan_line

    cfg = get_config(ctx)
    given = parse_assignments(params)
    values = secrets.collect(cfg)
    backend = backend_for(cfg)
    if cfg.preflight if preflight is None else preflight:
        exclude = preflight_exclude(cfg, exclude, nodes)
    plan = backend.plan(RunRequest(experiment, given, run_name=run_name, nodes=nodes, max_restarts=max_restarts,
                                   exclusive=exclusive, time=time_limit, partition=partition,
                                   stall_timeout=stall_timeout, startup_timeout=startup_timeout, on_stall=on_stall,
                                   exclude=exclude, allow_drift=allow_drift, min_nodes=min_nodes,
                                   max_recoveries=max_recoveries, spares=spares))
    err = console(stderr=True)
    hint = plan_line(cfg, plan)   # over half a step on the network: one line naming a mode that is not
    if hint:
        err.print(hint, markup=False, highlight=False)
    started: list[RunHandle] = []
    try:
        final = asyncio.run(_run(backend, plan, values, detach=detach, err=err, started=started))
    except KeyboardInterrupt:
        if not started:
            raise
        err.print(f"\ndetached; run {plan.run} goes on.\n"
                  f"follow: higgsfield logs {plan.run} -f    stop: higgsfield kill {plan.run}")
        sys.exit(130)
    if final is None:
        return
    from rich.markup import escape

    style = _STATE_STYLE.get(final.state, "")
    extra = ""
    if final.failed_node:
        extra = f" (first failure: node {escape(clean(final.failed_node))}" + (
            f", rank {final.failed_rank})" if final.failed_rank is not None else ")")
    err.print(f"run {plan.run} [{style}]{escape(clean(final.state))}[/]{extra}")
    _print_failure(err, final)
    sys.exit(exit_code(final))


async def _run(backend: Backend, plan: Any, values: dict[str, str], *, detach: bool, err: Console,
               started: list[RunHandle]) -> RunStatus | None:
    """Start, follow and ask the final status in one session: its connections open once, for all three.

    The run's end is learnt from its log streams ending (each node ends its stream
    when its part ended), then its status is asked once (again only while a lagging
    node's record still says it runs). None when detached.
    """
    from higgsfield.contract.errors import NodeLost

    async with backend.session(plan) as session:
        handle = await session.start(plan, secrets=values)
        started.append(handle)
        for note in handle.notes:
            err.print(clean(note), markup=False, highlight=False)
        err.print(f"[bold]run[/] {handle.run} started {backend.describe(handle)}", markup=True, highlight=False)
        if detach:
            err.print(f"follow: higgsfield logs {handle.run} -f    stop: higgsfield kill {handle.run}")
            click.echo(handle.run)
            return None
        try:
            await print_stream(session.follow(handle), color=sys.stdout.isatty())
        except NodeLost as lost:  # the nodes decide the run: its final status says how it ended
            err.print(f"{clean(str(lost))}", style="red", markup=False, highlight=False)
        return await session.final_status(handle.run)


def exit_code(status: RunStatus) -> int:
    """``run``'s exit code: 0 when the run succeeded; else the failing node's (a signal N as 128+N), at least 1."""
    if status.state == SUCCEEDED:
        return 0
    code = status.exit_code if status.state == FAILED else None
    if not code:
        return 1
    return min(255, 128 - code if code < 0 else code)


def _print_failure(out: Console, status: RunStatus, indent: str = "  ") -> None:
    """The first failure's reason and the last lines of its error (what a node sent is shown, never obeyed);
    a run that stalled: where its ranks were, group by group."""
    if status.state not in (FAILED, STALLED):
        return
    if status.reason:
        out.print(f"{indent}{clean(status.reason)}", markup=False, highlight=False)
    for line in status.error_tail:
        out.print(f"{indent}| {clean(line)}", markup=False, highlight=False)
    _print_stall(out, status, indent)


def _print_stall(out: Console, status: RunStatus, indent: str) -> None:
    from higgsfield.control.backends.stall import diagnosis_of

    diagnosis = diagnosis_of(status)
    if diagnosis is None:
        return
    if not (status.reason or "").startswith("stalled"):
        out.print(f"{indent}stalled: {clean(diagnosis.summary)}", markup=False, highlight=False)
    for i, g in enumerate(diagnosis.groups):
        label = "most" if i == 0 else "odd"
        out.print(f"{indent}  {label}: {clean(', '.join(g.ranks))} {clean(g.where)}", markup=False,
                  highlight=False)
    out.print(f"{indent}every rank's stack at the stall: higgsfield stacks {clean(status.run)}", markup=False,
              highlight=False)


@click.command()
@click.argument("target", metavar="EXPERIMENT|RUN", callback=run_name)
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the run ends.")
@click.option("--node", default=None, help="Only this node (its name, or its host when no other node shares it).")
@click.option("--rank", "ranks", type=click.IntRange(min=0), multiple=True, help="Only this global rank (repeatable).")
@click.option("--since", metavar="T", callback=since_option,
              help="Only lines written since T: 30s, 10m, 2h, 1d ago, or a local time like 2026-11-30T10:00. "
                   "The launcher's log has no line times: shown whole if it changed since T, "
                   "else only what -f sees added.")
@click.pass_context
def logs(ctx: click.Context, target: str, follow: bool, node: str | None, ranks: tuple[int, ...],
         since: float | None) -> None:
    """Print the merged logs of a run (an experiment name means its latest run)."""
    cfg = get_config(ctx)
    try:
        asyncio.run(_logs(cfg, target, follow=follow, node=node, ranks=ranks, since=since))
    except KeyboardInterrupt:
        sys.exit(130)


async def _logs(cfg: Config, target: str, *, follow: bool, node: str | None, ranks: tuple[int, ...],
                since: float | None) -> None:
    """Find the run and print its logs in one session (following: re-attaching over the same connections)."""
    from higgsfield.control.backends import backend_for

    async with backend_for(cfg).session() as session:
        status = await session.find(target)
        lines = session.logs(status, follow=follow, node=node, ranks=ranks, since=since)
        await print_stream(lines, color=sys.stdout.isatty())


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """List runs on every node: state, nodes, start, duration, exit code, first failure."""
    from rich.text import Text

    from higgsfield.control.cli._status_table import GAP, failure_of, fmt_time, layout, skip_warnings

    cfg = get_config(ctx)
    listed = asyncio.run(_status(cfg))
    runs, unreachable = listed.runs, listed.unreachable
    for warning in skip_warnings(listed.skipped):
        click.echo(warning, err=True)
    if as_json:
        from higgsfield.contract.runstatus import status_json
        from higgsfield.control.backends.stall import stall_fields

        click.echo(json.dumps({"runs": [{**status_json(r), **stall_fields(r)} for r in runs],
                               "unreachable": unreachable}, indent=2))
        return
    out = console()
    if runs:
        titles, widths, rows = layout(runs, out.width)
        out.print(Text((" " * GAP).join(t.ljust(w) for t, w in zip(titles, widths, strict=True)).rstrip(),
                       style="bold"))
        for r, row in zip(runs, rows, strict=True):
            line = Text()
            for i, (title, cell, w) in enumerate(zip(titles, row, widths, strict=True)):
                line.append(" " * GAP if i else "")
                line.append(clean(cell).ljust(w), style=_STATE_STYLE.get(r.state, "") if title == "STATE" else "")
            line.rstrip()
            out.print(line)
        for r in [r for r in runs[-RECENT_FAILURES:] if r.recoveries]:
            for a in r.recoveries:
                out.print(clean(f"{r.run}: recovery at {fmt_time(a.at)}: {', '.join(a.lost)} lost; attempt "
                                f"{a.number} went on on {', '.join(a.nodes)}"), markup=False, highlight=False)
        for r in [r for r in runs[-RECENT_FAILURES:] if r.state in (FAILED, STALLED)]:
            what = "stalled" if r.state == STALLED else f"first failure on {failure_of(r)}"
            out.print(f"\n{clean(r.run)}: {clean(what)}:", markup=False, highlight=False)
            _print_failure(out, r)
        for r in [r for r in runs if r.active and r.stragglers]:   # named by their own work per step
            out.print(f"\n{clean(r.run)}: " + "; ".join(f"straggler: {clean(s.summary)}" for s in r.stragglers),
                      markup=False, highlight=False)
    else:
        out.print("no runs yet: start one with 'higgsfield run EXPERIMENT'")
    for node, reason in unreachable.items():
        out.print(f"[red]{node}: unreachable: {reason}[/]", highlight=False)
    if unreachable:
        sys.exit(1)


async def _status(cfg: Config) -> RunList:
    from higgsfield.control.backends import backend_for

    async with backend_for(cfg).session() as session:
        return await session.runs()


@click.command()
@click.argument("target", metavar="EXPERIMENT|RUN", callback=run_name)
@click.pass_context
def kill(ctx: click.Context, target: str) -> None:
    """Stop a run (or every active run of an experiment) on every node."""
    cfg = get_config(ctx)
    for r in asyncio.run(_kill(cfg, target)):
        click.echo(f"{clean(r.run)}: {clean(r.state)}")   # names read from a node's disk: shown, never obeyed


async def _kill(cfg: Config, target: str) -> list[RunStatus]:
    from higgsfield.control.backends import backend_for

    async with backend_for(cfg).session() as session:
        return await session.kill(target)


@click.command()
@click.option("--dirty", is_flag=True, help="Include uncommitted changes (tracked and untracked, not ignored).")
@click.pass_context
def deploy(ctx: click.Context, dirty: bool) -> None:
    """Ship the project's committed code to every node (or a Slurm cluster's workdir) and build its image there."""
    from higgsfield.control.backends import backend_for

    cfg = get_config(ctx)
    result = backend_for(cfg).deploy(dirty=dirty, console=console(stderr=True))
    click.echo(f"deployed {result.commit[:12]} to {len(result.nodes)} node(s) in {result.seconds:.1f}s")


@click.command()
@click.argument("target", metavar="RUN", callback=run_name)
@click.argument("dest", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--step", default="latest", show_default=True, metavar="N|latest",
              help="The checkpoint step to bring (it must be complete on every node).")
@click.option("--logs", "with_logs", is_flag=True, help="Also every rank's logs and the run record, "
              "into DEST/logs/<node>/.")
@click.option("--hf", "to_hf", is_flag=True, help="Also convert the step to a Hugging Face directory "
              "(safetensors, config, tokenizer) in DEST/hf/step_XXXXXXXX; needs torch and transformers here.")
@click.pass_context
def pull(ctx: click.Context, target: str, dest: Path | None, step: str, with_logs: bool, to_hf: bool) -> None:
    """Bring a run's checkpoint home: every node's part merged into DEST/step_XXXXXXXX (default ./pulled/RUN).

    Resumable and checksummed: a re-run skips what is here whole and continues what is not.
    """
    from higgsfield.control.backends.nodes.pull import export_hf, step_name

    if step != "latest":
        step = step_name(step)  # a bad --step is one line, exit 2, before any node is asked
    cfg = get_config(ctx)
    result = asyncio.run(_pull(cfg, target, dest, step, with_logs))
    where = clean(str(result.dest / result.step))
    click.echo(f"pulled {result.step} of {clean(target)} from {len(result.nodes)} node(s) to {where}: "
               f"{len(result.fetched)} file(s) copied ({result.bytes / 1e6:.1f} MB), "
               f"{len(result.skipped)} already here"
               + (f"; logs in {clean(str(result.dest / 'logs'))}" if with_logs else ""))
    if to_hf:
        out = export_hf(result.dest / result.step, result.dest / "hf" / result.step)
        click.echo(f"converted {result.step} to a Hugging Face directory: {clean(str(out))} "
                   "(AutoModelForCausalLM.from_pretrained loads it)")


async def _pull(cfg: Config, target: str, dest: Path | None, step: str, with_logs: bool) -> Any:
    """The pull with a progress bar of bytes and rate on stderr (none when stderr is not a terminal)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from higgsfield.control.backends.nodes.pull import Progress as Callbacks
    from higgsfield.control.backends.select import pull

    err = console(stderr=True)
    bar = Progress("pull", BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                   console=err, disable=not err.is_terminal, transient=True)
    task = bar.add_task("pull", total=0)
    callbacks = Callbacks(total=lambda n: bar.update(task, total=n),
                          advance=lambda n: bar.advance(task, n))
    with bar:
        return await pull(cfg, target, dest, step=None if step == "latest" else step, logs=with_logs,
                          progress=callbacks)

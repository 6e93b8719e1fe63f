"""``higgsfield profile RUN``: a live run's ranks profiled for their next N steps, with no restart.

The traces come home to ``./profiles/<run>/<time>/`` (``--out``): one Chrome trace per rank and
``merged.trace.json``, every rank on one clock (Perfetto: ui.perfetto.dev, or chrome://tracing).
Per rank it prints the top operators and the share of the steps in compute, communication
and waiting (:mod:`higgsfield.contract.traces`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from higgsfield.control.cli._common import get_config, run_name
from higgsfield.control.cli._lines import clean


@click.command()
@click.argument("target", metavar="EXPERIMENT|RUN", callback=run_name)
@click.option("--steps", type=click.IntRange(1, 100), default=3, show_default=True, help="Steps to profile.")
@click.option("--node", default=None, help="Only this node's ranks (its name, or its host).")
@click.option("--rank", type=click.IntRange(min=0), default=None, help="Only this global rank.")
@click.option("--memory", is_flag=True, help="Also a CUDA memory snapshot per rank (GPU only).")
@click.option("--out", "dest", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the traces go (default ./profiles/RUN/TIME).")
@click.option("--timeout", type=click.FloatRange(5, 3600), default=60.0, show_default=True,
              help="Seconds each node waits for its ranks' traces (a step boundary, then STEPS steps).")
@click.pass_context
def profile(ctx: click.Context, target: str, steps: int, node: str | None, rank: int | None, memory: bool,
            dest: Path | None, timeout: float) -> None:
    """Profile the next STEPS steps of every rank of a running run (torch.profiler), without a restart.

    Each rank starts the profiler at its next step boundary (it reads the request at most once a
    second) and writes a Chrome trace; the traces are fetched like `pull` fetches checkpoints. The
    training loop must call higgsfield.training.progress(step) (StepTimer.step does). Exit 1 when some rank
    asked for gave no trace (the others' are kept).
    """
    from higgsfield.contract.traces import shares_line

    cfg = get_config(ctx)
    if cfg.slurm is not None:   # through the login node: the run's directory is in the shared workdir
        from higgsfield.control.backends.slurm.profile import profile_run
    else:
        from higgsfield.control.backends.nodes.profile import profile_run  # type: ignore[assignment]
    res = asyncio.run(profile_run(cfg, target, steps=steps, node=node, rank=rank, memory=memory, dest=dest,
                                  timeout=timeout))
    for n, why in res.unreachable.items():
        click.echo(f"warning: {clean(n)}: no profile: {clean(why)}", err=True)
    if res.missing:
        click.echo(f"warning: no trace in {timeout:.0f}s from {', '.join(res.missing)} (did the run end, or does "
                   "its loop not call higgsfield.training.progress?)", err=True)
    for r in res.ranks:
        who = f"{clean(r.node)}/{r.done.rank}"
        if r.done.error:
            click.echo(f"{who}: the profiler failed: {clean(r.done.error)}")
            continue
        if r.summary is None:
            click.echo(f"{who}: no trace came back")
            continue
        click.echo(f"{who}: {shares_line(r.summary)} (steps {', '.join(map(str, r.summary.steps))})")
        for op in r.summary.top:
            click.echo(f"    {op.self_ms:10.3f} ms  {op.calls:6d}x  {clean(op.name)}")
        if memory:
            click.echo(f"    memory: {clean(r.done.memory)}" if r.done.memory else f"    {clean(r.done.memory_note)}")
    if res.merged is not None:
        click.echo(f"{len([r for r in res.ranks if r.trace])} trace(s) in {clean(str(res.dest))} "
                   f"({res.seconds:.1f}s); every rank in one timeline: {clean(str(res.merged))} "
                   "(open it in ui.perfetto.dev)")
    if res.missing or res.unreachable or not res.ranks or any(r.summary is None for r in res.ranks):
        raise click.exceptions.Exit(1)   # some rank asked for gave no trace: said above, the rest kept

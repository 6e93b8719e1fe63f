"""``higgsfield invoker stats | metrics``: the node-side commands the dashboard and ``higgsfield metrics`` read.

They join the hidden ``invoker`` group (:mod:`higgsfield.node.cli`); output is JSON
(one object, or one per line with ``--follow``), as for every invoker command.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from higgsfield.contract.codec import encode
from higgsfield.node.state.home import NodeState


def _home(ctx: click.Context) -> NodeState:
    """The node's state of this invocation (``--state-dir``), built once by the ``invoker`` group."""
    home = ctx.find_object(NodeState)
    assert home is not None, "the invoker group builds it"
    return home


def _line(data: Any) -> None:
    sys.stdout.write(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")
    sys.stdout.flush()


@click.command()
@click.option("--follow", "-f", is_flag=True, help="Keep sampling, one JSON line per sample, until stopped.")
@click.option("--every", type=click.FloatRange(0.1, 3600), default=2.0, show_default=True,
              help="With --follow: seconds between machine samples.")
@click.option("--project", default=None, help="With --follow: also send this project's run records and the "
                                                "node's queue whenever they change.")
@click.pass_context
def stats(ctx: click.Context, follow: bool, every: float, project: str | None) -> None:
    """Print this node's CPU, memory, disk and GPUs (nvidia-smi), once or as a live feed."""
    from higgsfield.node.observe.stats import Sampler

    home = _home(ctx)
    if not follow:
        sampler = Sampler(home)
        try:
            _line(encode(sampler.sample()))
        finally:
            sampler.close()
        return
    from higgsfield.node.observe.watch import feed

    try:
        feed(home, every=every, project=project, emit=_line)
    except (BrokenPipeError, KeyboardInterrupt):   # the reader went away: that is how a feed ends
        sys.exit(0)


@click.command()
@click.option("--project", required=True)
@click.option("--run", "run_name", required=True)
@click.option("--follow", "-f", is_flag=True, help="Keep printing steps until the run ends.")
@click.option("--skip", type=click.IntRange(min=0), default=0, help="Leave out the first N lines.")
@click.option("--heartbeat", type=float, default=None, help="With -f: print '#hb' after this many quiet seconds.")
@click.pass_context
def metrics(ctx: click.Context, project: str, run_name: str, follow: bool, skip: int,
            heartbeat: float | None) -> None:
    """Print the run's step metrics (JSON lines; only node 0 of a run has them).

    Each line is a checked StepMetrics; lines of the file that are not one are left out
    and their running total is printed as ``#skipped N`` (``#hb``: a heartbeat).
    """
    from higgsfield.contract.errors import RunError
    from higgsfield.metrics import HEARTBEAT_LINE, Skipped, skipped_line
    from higgsfield.node.observe.metrics import read_metrics
    from higgsfield.node.runs.stop import refresh
    from higgsfield.node.state.records import RunDir

    rd = RunDir(_home(ctx), project, run_name)
    if not rd.exists():
        raise RunError(f"no run '{run_name}' of project '{project}' on this node")
    out = sys.stdout
    for item in read_metrics(rd, follow=follow, is_done=lambda: refresh(rd).terminal, skip=skip,
                             heartbeat=heartbeat):
        if item is None:
            text = HEARTBEAT_LINE
        elif isinstance(item, Skipped):
            text = skipped_line(item.count)
        else:
            text = item.to_json()
        out.write(text + "\n")
        out.flush()

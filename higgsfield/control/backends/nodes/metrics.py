"""A run's step metrics, read from its node 0 (where rank 0 writes ``metrics.jsonl``).

Used by ``higgsfield metrics RUN`` and by the dashboard's training curves, through
``Session.metrics``: both read them through node 0's ``higgsfield invoker metrics`` over a
connection they hold, so the terminal and the page show the same figures. (A Slurm run's
file is in the shared workdir: the login node's invoker reads it, and :func:`parse_metrics`
turns either node's output into StepMetrics.)

Use::

    async with connect(cfg) as group:
        status = await find_run(group, cfg, "tiny_llama")
        async for m in read_metrics(group, cfg, status, follow=True):
            ...   # StepMetrics, in the order written; Skipped(total); None: a heartbeat (the run is quiet)

What crosses the connection is decoded again here (the node may run another version):
a line that is not a StepMetrics is skipped and counted with the node's own count, so
a view always gets one total of what it could not show.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from higgsfield.contract.errors import RunError
from higgsfield.contract.runstatus import RunStatus
from higgsfield.control.config import Config
from higgsfield.control.remote import Group
from higgsfield.control.remote.invoker import invoker_argv
from higgsfield.metrics import HEARTBEAT_LINE, MetricsItem, Skipped, decode_line, parse_skipped

HEARTBEAT_S = 5.0


def metrics_node(status: RunStatus) -> str:
    """The node that holds the run's metrics: its node 0 (rank 0's)."""
    if not status.nodes:
        raise RunError(f"run '{status.run}' has no nodes")
    return next(iter(status.nodes))


async def read_metrics(group: Group, cfg: Config, status: RunStatus, *, follow: bool = False,
                       skip: int = 0) -> AsyncIterator[MetricsItem]:
    """The run's metrics from its node 0 (a member of ``group``); with ``follow`` until the run ends."""
    node = metrics_node(status)
    member = next((m for m in group.members if m.name == node), None)
    if member is None:
        raise RunError(f"run '{status.run}': its node 0 ({node}) is not among the connected nodes")
    t = member.transport
    args = ["metrics", "--project", cfg.name, "--run", status.run, "--skip", str(skip)]
    if follow:
        args += ["--follow", "--heartbeat", f"{HEARTBEAT_S:g}"]
    async for m in parse_metrics(t.stream([*invoker_argv(cfg, cfg.node(t.node)), *args])):
        yield m


async def parse_metrics(lines: AsyncIterator[str]) -> AsyncIterator[MetricsItem]:
    """``higgsfield invoker metrics``' output as StepMetrics (None for its ``#hb`` heartbeat), whichever
    backend's node it came from; a ``#skipped N`` line, or a line here that is not a StepMetrics object,
    gives the new total of skipped lines as a :class:`Skipped`."""
    on_node = here = 0
    async for raw in lines:
        if raw == HEARTBEAT_LINE:
            yield None
            continue
        total = parse_skipped(raw)
        if total is not None:
            on_node = total
            yield Skipped(on_node + here)
            continue
        if not raw.strip():
            continue
        try:
            m = decode_line(raw)
        except ValueError:
            here += 1
            yield Skipped(on_node + here)
            continue
        yield m

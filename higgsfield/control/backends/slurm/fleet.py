"""A Slurm cluster for the dashboard: its runs and its partition's nodes, asked of Slurm through the login node.

:class:`ClusterFleet` is the dashboard's :class:`~higgsfield.control.backends.backend.Fleet` for a project
with a ``slurm:`` block (:meth:`~higgsfield.control.backends.slurm.backend.SlurmBackend.fleet`). Slurm
pushes nothing and its nodes run no higgsfield feed, so the fleet asks, over the one connection
the dashboard holds to the login node (the backend's
:class:`~higgsfield.control.backends.slurm.session.SlurmSession`):

- the runs every ``RUNS_EVERY_S`` (one read of the workdir's run records, one squeue, one
  sacct: the very ``status`` of the CLI), and at once after the page kills or starts one;
- the partition's nodes every ``NODES_EVERY_S`` (``sinfo -N``: state, load, memory, GPUs).

That is a few light commands every few seconds for one user's page, far below what
Slurm's own tools poll. The login node is the node view's first card (down, with the
reason, when it does not answer; its runs then stay listed as last known), the compute
nodes follow, each with the runs that hold it; the login card lists the jobs Slurm keeps
pending, with Slurm's reason (Resources, Priority).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import TYPE_CHECKING, Any

from higgsfield.contract.codec import encode
from higgsfield.contract.errors import RunError
from higgsfield.contract.feed import QueueEntry
from higgsfield.contract.runstatus import RunStatus, status_json
from higgsfield.contract.states import QUEUED, RUNNING
from higgsfield.control.backends.backend import Changed, Plan, RunHandle
from higgsfield.control.backends.fleet import CONNECTING, DOWN, HISTORY, UP, why
from higgsfield.control.backends.slurm import ClusterNode
from higgsfield.control.backends.slurm.session import SlurmPlan, SlurmSession
from higgsfield.control.config import Config, NodeConfig

if TYPE_CHECKING:
    import anyio.abc

RUNS_EVERY_S = 2.0
NODES_EVERY_S = 5.0
MIB = 1 << 20


class ClusterFleet:
    """The runs and nodes of the cluster of ``cfg``'s ``slurm:`` block, as Slurm reports them.

    ``login`` is the cluster's login node, ``partition`` the project's (None: the cluster's default),
    ``connect`` opens the backend's session to the login node (held for the fleet's whole life).
    """

    def __init__(self, cfg: Config, login: NodeConfig, partition: str | None,
                 connect: Callable[[], AbstractAsyncContextManager[SlurmSession]], changed: Changed, *,
                 every: float | None = None) -> None:
        self.cfg = cfg
        self.changed = changed
        self.connect = connect
        self.login_name, self.login_host = str(login.name), str(login.host)
        self.partition = partition
        self.every = every if every is not None else RUNS_EVERY_S
        self.label = f"Slurm partition {self.partition or '(default)'} through {self.login_name}"
        self.state: str = CONNECTING
        self.reason: str | None = None
        self.since = time.time()
        self._runs: list[RunStatus] = []
        self._machines: list[ClusterNode] = []
        self._history: dict[str, deque[list[float | None]]] = {}
        self._machines_at = 0.0
        self._wake = asyncio.Event()
        self._stack = AsyncExitStack()
        self._session: SlurmSession | None = None
        self._watching: anyio.abc.TaskGroup | None = None

    # -- life ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and start the watch; :meth:`close` (in the same task: the watch's task group is entered
        here and left there) stops it, then disconnects."""
        import anyio  # here, not at the top: the CLI imports this module too, and anyio comes with the 'ui' extra

        self._session = await self._stack.enter_async_context(self.connect())
        self._watching = await self._stack.enter_async_context(anyio.create_task_group())
        self._watching.start_soon(self._watch, name="slurm-watch")

    async def close(self) -> None:
        if self._watching is not None:
            self._watching.cancel_scope.cancel()   # the watch stops; the stack leaves its group, then disconnects
        await self._stack.aclose()

    async def _watch(self) -> None:
        while True:
            try:
                await self._look()
                self._mark(UP, None)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the login node's failure, shown on its card
                self._mark(DOWN, why(e))
                # a failed connect is remembered by the transport: forget it so the next tick logs in afresh
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.session().transport.close(), 5)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.every)
            self._wake.clear()

    async def _look(self) -> None:
        s = self.session()
        runs = (await s.runs()).runs
        if [status_json(r) | {"duration": None} for r in runs] != \
                [status_json(r) | {"duration": None} for r in self._runs]:
            self._runs = runs
            self.changed("runs")
        now = time.monotonic()
        if now - self._machines_at >= NODES_EVERY_S:
            self._machines_at = now
            self._machines = await s.machines()
            for n in self._machines:
                self._history.setdefault(n.name, deque(maxlen=HISTORY)).append(_point(n))
            self.changed("node")

    def _mark(self, state: str, reason: str | None) -> None:
        if (self.state, self.reason) != (state, reason):
            if state != self.state:
                self.since = time.time()
            self.state, self.reason = state, reason
            self.changed("node")

    # -- the state ----------------------------------------------------------------------------

    def runs(self) -> list[RunStatus]:
        return list(self._runs)

    def nodes(self) -> list[dict[str, Any]]:
        pending = [r for r in self._runs if r.state == QUEUED]
        login = {"name": self.login_name, "host": f"{self.login_host} (login node)", "state": self.state,
                 "reason": self.reason, "since": self.since, "sample": None, "history": [],
                 "label": {UP: "up", DOWN: "not answering"}.get(self.state, "connecting"),
                 # waiting for an allocation (no slot count: the page shows the run's reason, Slurm's)
                 "queue": [encode(QueueEntry(self.cfg.name, r.run)) for r in pending]}
        holders: dict[str, list[str]] = {}
        for r in self._runs:
            if r.state == RUNNING:
                for host in r.nodes:
                    holders.setdefault(host, []).append(r.run)
        return [login, *(self._node_card(n, holders.get(n.name, [])) for n in self._machines)]

    def _node_card(self, n: ClusterNode, runs: list[str]) -> dict[str, Any]:
        sample: dict[str, Any] = {"cpu_count": n.cpus, "gpus": []}
        if n.cpus and n.cpu_load is not None:
            sample["cpu_percent"] = min(100.0, 100.0 * n.cpu_load / n.cpus)
        if n.memory_mib:
            sample["mem_total"] = n.memory_mib * MIB
            sample["mem_used"] = (n.memory_mib - (n.free_mib or 0)) * MIB if n.free_mib is not None else None
        gpus = f"{n.gpus} GPU(s) ({n.gres})" if n.gpus else "no GPUs in its gres"
        return {"name": n.name, "host": f"partition {self.partition or '(default)'}", "state": UP if n.usable else DOWN,
                "label": n.state + ("" if n.responding else " (not responding)"),
                "reason": n.reason or (None if n.usable else n.state), "since": self.since, "sample": sample,
                "history": list(self._history.get(n.name, ())), "note": f"Slurm: {gpus}",
                # the run holds the node: Slurm allocated it, no higgsfield slots are counted (slots [])
                "queue": [encode(QueueEntry(self.cfg.name, run, slots=[], committed=True)) for run in runs]}

    def places(self, status: RunStatus) -> dict[str, Any]:
        return {"stale_nodes": sorted(status.nodes) if self.state == DOWN else [], "queue": {},
                "queue_position": None}   # Slurm's queue: its reason is in the status

    # -- actions ------------------------------------------------------------------------------

    def session(self, nodes: Sequence[str] | None = None) -> SlurmSession:
        if self._session is None:
            raise RunError("the dashboard is not connected to the login node yet")
        return self._session

    def where(self, plan: Plan) -> str:
        assert isinstance(plan, SlurmPlan)
        st = plan.settings
        return (f"as a Slurm job of {st.nodes} node(s) on partition {st.partition or '(default)'}"
                f" through {self.login_name}")

    def learn(self, handle: RunHandle) -> None:
        self.poke()

    def poke(self) -> None:
        self._wake.set()


def _point(n: ClusterNode) -> list[float | None]:
    """[time, cpu %, memory %, None] for the node's sparklines (Slurm reports no GPU utilisation)."""
    cpu = min(100.0, 100.0 * n.cpu_load / n.cpus) if n.cpus and n.cpu_load is not None else None
    mem = 100.0 * (n.memory_mib - n.free_mib) / n.memory_mib if n.memory_mib and n.free_mib is not None else None
    return [time.time(), cpu, mem, None]

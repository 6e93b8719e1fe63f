"""SSH nodes for the dashboard: one live feed per node, over the connection it holds open for its whole life.

:class:`NodesFleet` is the dashboard's :class:`~higgsfield.control.backends.backend.Fleet` for a project
of SSH nodes (:meth:`~higgsfield.control.backends.nodes.backend.NodesBackend.fleet`): one
:class:`NodeFeed` per node, their records merged as ``higgsfield status`` merges them, and the
SSH backend's Session over the same connections.

Each node runs ``higgsfield invoker stats --follow --project P`` (see
:mod:`higgsfield.node.observe.watch`) on the dashboard's connection to it: a machine sample
every ``SAMPLE_EVERY_S``, and the project's run records and the node's queue whenever
they change. Nothing is polled and no process is started per refresh, on either side.
Each line is decoded once, as it arrives (:class:`~higgsfield.contract.feed.FeedLine`: a
:class:`~higgsfield.contract.feed.NodeSample`, typed records and queue entries); the page
gets a :class:`NodeView` of each node, encoded (``codec.encode``): the JSON the node printed.

A node is *up* while its feed speaks. A feed that ends or breaks marks the node down
at once (with the reason); one that goes silent (a frozen node, a dropped network that
TCP has not noticed) is marked down after ``SILENT_S``, then closed and opened again,
connection included, every few seconds until the node answers: so a node that stops
answering shows as such within ``SILENT_S`` plus one watchdog tick (under 10 s).
A down node keeps its last known records (shown as last known, not dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tenacity import AsyncRetrying, retry_if_exception, wait_exponential

from higgsfield.contract.codec import encode
from higgsfield.contract.feed import FeedLine, NodeSample, QueueEntry
from higgsfield.contract.noderuns import NodeRunView
from higgsfield.contract.runstatus import RunStatus
from higgsfield.contract.states import ACTIVE
from higgsfield.control.backends.backend import Changed, Plan, RunHandle
from higgsfield.control.backends.fleet import CONNECTING, DOWN, HISTORY, UP, why
from higgsfield.control.backends.nodes.fleet_drift import DriftWatch
from higgsfield.control.backends.nodes.fleet_fabric import FabricWatch
from higgsfield.control.backends.nodes.session import NodesSession
from higgsfield.control.backends.nodes.start import RunPlan
from higgsfield.control.backends.nodes.status import merge
from higgsfield.control.config import Config
from higgsfield.control.remote import Group, Member
from higgsfield.control.remote.invoker import invoker_argv

if TYPE_CHECKING:
    import anyio.abc

SAMPLE_EVERY_S = 2.0
SILENT_S = 6.0          # no line for this long: the node is not answering
WATCH_EVERY_S = 1.0
RETRY_MAX_S = 4.0


@dataclass
class NodeState:
    """What the dashboard knows of one node: reachability, the last sample and its history, records, queue."""

    name: str
    host: str
    state: str = CONNECTING
    reason: str | None = None
    since: float = field(default_factory=time.time)       # when ``state`` began (wall clock, for the page)
    heard: float = field(default_factory=time.monotonic)  # last line from the feed
    sample: NodeSample | None = None
    history: deque[list[float | None]] = field(default_factory=lambda: deque(maxlen=HISTORY))
    records: dict[str, NodeRunView] = field(default_factory=dict)   # run -> this node's record
    queue: list[QueueEntry] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)   # the node's files that do not decode, one line each

    def view(self, drift: list[str], fabric: dict[str, Any] | None) -> NodeView:
        """The page's view of the node, with its drift and fabric marks."""
        return NodeView(self.name, self.host, self.state, self.reason, self.since, self.sample, list(self.history),
                        list(self.queue), list(self.skipped), drift, fabric)

    def positions(self, project: str) -> dict[str, Place]:
        """``project``'s runs -> their place in this node's queue: the slots held, or the position among
        the waiters (1 = next; every project's waiters count: they wait for the same slots)."""
        out: dict[str, Place] = {}
        waiting = 0
        for e in self.queue:
            if e.slots is None:
                waiting += 1
            if e.project == project:
                out[e.run] = Place(0 if e.slots is not None else waiting, e.slots, e.want, e.committed)
        return out


@dataclass(frozen=True)
class NodeView:
    """What the page gets of a node (no secret: host name, figures, which run holds which slot)."""

    name: str
    host: str
    state: str
    reason: str | None
    since: float
    sample: NodeSample | None
    history: list[list[float | None]]
    queue: list[QueueEntry]
    skipped: list[str]
    drift: list[str]
    """The node's differences from the others (``fleet_drift``), one line each."""
    fabric: dict[str, Any] | None
    """Its figures from the last fabric test, ``slow`` when it was the outlier (``contract.fabric_last``)."""


@dataclass(frozen=True)
class Place:
    """A run's place in one node's queue, as the page shows it (``position`` 0: it holds ``slots``)."""

    position: int
    slots: list[int] | None
    want: int | None
    committed: bool


class _Down(Exception):
    """A node's feed ended or broke (the node is marked down): the feed is tried again."""


def _point(sample: NodeSample) -> list[float | None]:
    """[time, cpu %, memory %, mean GPU util % (None without GPUs)] for the sparklines."""
    gpus = [g.util_percent for g in sample.gpus if g.util_percent is not None]
    return [sample.time or time.time(), sample.cpu_percent,
            100.0 * sample.mem_used / sample.mem_total if sample.mem_total else None,
            sum(gpus) / len(gpus) if gpus else None]


class NodeFeed:
    """Keeps one node's feed running over ``member``'s transport; calls ``changed(kind)`` on news.

    ``kind`` is ``"node"`` for a sample or a change of reachability, ``"runs"`` when the
    node's records or queue changed.
    """

    def __init__(self, cfg: Config, member: Member, changed: Changed, *,
                 every: float = SAMPLE_EVERY_S, silent: float = SILENT_S) -> None:
        self.cfg = cfg
        self.member = member
        self.changed = changed
        self.every = every
        self.silent = silent
        self.state = NodeState(member.name, str(member.node.host))
        self._closing = False

    def argv(self) -> list[str]:
        return [*invoker_argv(self.cfg, self.member.node), "stats", "--follow", "--every", f"{self.every:g}",
                "--project", self.cfg.name]

    def closing(self) -> None:
        """The dashboard is closing: a feed that ends now is not tried again (its task group then ends it)."""
        self._closing = True

    def _mark(self, state: str, reason: str | None = None) -> None:
        st = self.state
        if st.state != state or st.reason != reason:
            if st.state != state:
                st.since = time.time()
            st.state, st.reason = state, reason
            self.changed("node")

    async def run(self) -> None:
        """The feed for the dashboard's whole life: tried again after 1, 2, 4, 4... seconds (tenacity) each
        time it ends or breaks, until the dashboard closes (its fleet's task group is cancelled)."""
        retrying = AsyncRetrying(wait=wait_exponential(max=RETRY_MAX_S),
                                 retry=retry_if_exception(lambda e: isinstance(e, Exception) and not self._closing))
        with contextlib.suppress(_Down):   # the last try, ended while closing: nothing to raise into the group
            async for attempt in retrying:
                with attempt:
                    await self._once()

    async def _once(self) -> None:
        """One connection's feed, followed until it ends or breaks; then the node is marked down (with the
        reason), the connection dropped (the next try logs in afresh: the same single connection), and
        :class:`_Down` raised, for :meth:`run` to wait and try again."""
        try:
            await self._follow()
            reason = "its feed ended"
        except Exception as e:  # noqa: BLE001 - any failure is this node's, shown on the page
            reason = why(e)
        self._mark(DOWN, reason)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.member.transport.close(), 5)
        raise _Down(reason)

    async def _follow(self) -> None:
        stream = self.member.transport.stream(self.argv())
        lines = stream.__aiter__()
        try:
            while True:
                try:
                    raw = await asyncio.wait_for(lines.__anext__(), self.silent)
                except StopAsyncIteration:
                    return
                except asyncio.TimeoutError:
                    raise TimeoutError(f"no answer for {self.silent:g}s") from None
                self.state.heard = time.monotonic()
                self._apply(raw)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(stream.aclose(), 5)  # type: ignore[attr-defined]

    def _apply(self, raw: str) -> None:
        line = FeedLine.parse(raw)   # decoded once, here (a part that does not decode is not shown)
        if line is None:
            return  # a login banner or a stray print: not the feed's
        st = self.state
        if st.state != UP:
            self._mark(UP)
        if line.node is not None:
            st.sample = line.node
            st.history.append(_point(line.node))
            self.changed("node")
        runs_changed = False
        if line.runs is not None:
            if line.full:
                st.records = {}
            st.records.update((view.run, view) for view in line.runs)
            runs_changed = True
        if line.skipped is not None:
            st.skipped = line.skipped
            self.changed("node")
        if line.queue is not None:
            st.queue = line.queue   # every project's: they share the slots
            runs_changed = True
            self.changed("node")
        if runs_changed:
            self.changed("runs")


class NodesFleet:
    """The SSH nodes of higgsfield.yml: their feeds (pushed, never polled) and the SSH backend's Session."""

    def __init__(self, cfg: Config, changed: Changed, *, every: float | None = None,
                 silent: float | None = None) -> None:
        self.cfg = cfg
        self.changed = changed
        self.group = Group.of(cfg, cfg.nodes)
        self.feeds = [NodeFeed(cfg, m, changed, every=SAMPLE_EVERY_S if every is None else every,
                               silent=SILENT_S if silent is None else silent) for m in self.group.members]
        self.label = f"{len(cfg.nodes)} node(s)"
        self.drift = DriftWatch(cfg, lambda: [f.member for f in self.feeds if f.state.state == UP],
                                lambda: changed("nodes"))
        self.fabric = FabricWatch(cfg, lambda: [f.member for f in self.feeds if f.state.state == UP],
                                  lambda: changed("nodes"))
        self._stack = AsyncExitStack()
        self._tasks: anyio.abc.TaskGroup | None = None   # the feeds and the watches: they end with the dashboard

    async def start(self) -> None:
        """Connect every node (a host key that is not the pinned one refuses the whole dashboard) and
        start the feeds and the watches in a task group of the fleet's own; a node that cannot be reached
        is shown down and tried again, it stops nothing. :meth:`close` is awaited in the same task (the
        group is entered here and left there)."""
        import anyio  # here, not at the top: the CLI imports this module too, and anyio comes with the 'ui' extra

        await self.group.connect()
        self._tasks = await self._stack.enter_async_context(anyio.create_task_group())
        for f in self.feeds:
            self._tasks.start_soon(f.run, name=f"feed-{f.member.name}")
        self._tasks.start_soon(self.drift.run, name="drift-watch")
        self._tasks.start_soon(self.fabric.run, name="fabric-watch")

    async def close(self) -> None:
        for f in self.feeds:
            f.closing()
        if self._tasks is not None:
            self._tasks.cancel_scope.cancel()   # the feeds and watches stop; the stack leaves their group
        await self._stack.aclose()
        await self.group.close()

    def runs(self) -> list[RunStatus]:
        """The nodes' records merged as ``higgsfield status`` merges them (a node that is down: its last known)."""
        runs = merge([rec for f in self.feeds for rec in f.state.records.values()])
        self.fabric.seen(s.run for s in runs if s.state == "succeeded")   # a fabric test just ended: its result
        return runs

    def nodes(self) -> list[dict[str, Any]]:
        # the Nodes view marks a drifted node, and shows its last fabric figures (a slow one marked)
        return [encode(f.state.view(self.drift.marks(f.state.name), self.fabric.marks(f.state.name)))
                for f in self.feeds]

    def places(self, status: RunStatus) -> dict[str, Any]:
        down = {f.state.name for f in self.feeds if f.state.state != UP}
        queue: dict[str, Place] = {}
        for f in self.feeds:
            if f.state.name in status.nodes:
                place = f.state.positions(self.cfg.name).get(status.run)
                if place is not None:
                    queue[f.state.name] = place
        waiting = [p.position for p in queue.values() if p.position]
        return {"stale_nodes": sorted(down & set(status.nodes)), "queue": encode(queue),
                "queue_position": max(waiting) if waiting and status.state in ACTIVE else None}

    def session(self, nodes: Sequence[str] | None = None) -> NodesSession:
        members = self.group.members if nodes is None else [m for m in self.group.members if m.name in nodes]
        return NodesSession(self.cfg, Group(members))

    def where(self, plan: Plan) -> str:
        assert isinstance(plan, RunPlan)
        return f"on {', '.join(str(n.name) for n in plan.nodes)}"

    def learn(self, handle: RunHandle) -> None:
        """Records a node just answered (a start): known now, before its feed reports them."""
        feeds = {f.state.name: f for f in self.feeds}
        for view in handle.records:
            f = feeds.get(view.node)
            if f is not None:
                f.state.records.setdefault(view.run, view)
        self.changed("runs")

    def poke(self) -> None:
        """Nothing to do: the nodes push every change of their records."""

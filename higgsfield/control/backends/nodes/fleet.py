"""SSH nodes for the dashboard: one live feed per node, over the connection it holds open for its whole life.

:class:`NodesFleet` is the dashboard's :class:`~higgsfield.control.backends.backend.Fleet` for a project
of SSH nodes (:meth:`~higgsfield.control.backends.nodes.backend.NodesBackend.fleet`): one
:class:`NodeFeed` per node, their records merged as ``higgsfield status`` merges them, and the
SSH backend's Session over the same connections.

Each node runs ``higgsfield invoker stats --follow --project P`` (see
:mod:`higgsfield.node.observe.watch`) on the dashboard's connection to it: a machine sample
every ``SAMPLE_EVERY_S``, and the project's run records and the node's queue whenever
they change. Nothing is polled and no process is started per refresh, on either side.

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
import json
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from higgsfield.contract.decode import DecodeError
from higgsfield.contract.runspec import ACTIVE, NodeRunView, RunStatus
from higgsfield.contract.text import one_line
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
    sample: dict[str, Any] | None = None
    history: deque[list[float | None]] = field(default_factory=lambda: deque(maxlen=HISTORY))
    records: dict[str, dict[str, Any]] = field(default_factory=dict)   # run -> this node's record
    queue: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)   # the node's files that do not decode, one line each

    def to_dict(self) -> dict[str, Any]:
        """The page's view of the node (no secret: host name, figures, which run holds which slot)."""
        return {"name": self.name, "host": self.host, "state": self.state, "reason": self.reason,
                "since": self.since, "sample": self.sample, "history": list(self.history),
                "queue": self.queue, "skipped": list(self.skipped)}

    def positions(self, project: str) -> dict[str, dict[str, Any]]:
        """``project``'s runs -> their place in this node's queue: the slots held, or the position among
        the waiters (1 = next; every project's waiters count: they wait for the same slots)."""
        out: dict[str, dict[str, Any]] = {}
        waiting = 0
        for e in self.queue:
            held = e.get("slots")
            if held is None:
                waiting += 1
            if e.get("project") != project:
                continue
            out[str(e.get("run"))] = {"position": 0 if held is not None else waiting, "slots": held,
                                      "want": e.get("want"), "committed": bool(e.get("committed"))}
        return out


def _point(sample: dict[str, Any]) -> list[float | None]:
    """[time, cpu %, memory %, mean GPU util % (None without GPUs)] for the sparklines."""
    mem_total = sample.get("mem_total") or 0
    gpus = [g.get("util_percent") for g in sample.get("gpus") or [] if g.get("util_percent") is not None]
    return [float(sample.get("time") or time.time()), float(sample.get("cpu_percent") or 0.0),
            100.0 * float(sample.get("mem_used") or 0) / mem_total if mem_total else None,
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
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def argv(self) -> list[str]:
        return [*invoker_argv(self.cfg, self.member.node), "stats", "--follow", "--every", f"{self.every:g}",
                "--project", self.cfg.name]

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"feed-{self.member.name}")

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def _mark(self, state: str, reason: str | None = None) -> None:
        st = self.state
        if st.state != state or st.reason != reason:
            if st.state != state:
                st.since = time.time()
            st.state, st.reason = state, reason
            self.changed("node")

    async def _run(self) -> None:
        retry = 1.0
        while not self._closing:
            try:
                await self._follow()
                reason = "its feed ended"
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - any failure is this node's, shown on the page
                reason = why(e)
            self._mark(DOWN, reason)
            # A broken or silent connection is dropped; the next try logs in afresh (same single connection).
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.member.transport.close(), 5)
            await asyncio.sleep(retry)
            retry = min(retry * 2, RETRY_MAX_S)

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
        try:
            msg = json.loads(raw)
        except ValueError:
            return  # a login banner or a stray print: not the feed's
        if not isinstance(msg, dict):
            return
        st = self.state
        if st.state != UP:
            self._mark(UP)
        if isinstance(msg.get("node"), dict):
            st.sample = msg["node"]
            st.history.append(_point(st.sample))
            self.changed("node")
        runs_changed = False
        if isinstance(msg.get("runs"), list):
            if msg.get("full"):
                st.records = {}
            for rec in msg["runs"]:   # decoded once, here: one that does not decode is not shown
                with contextlib.suppress(DecodeError):
                    view = NodeRunView.from_dict(rec)
                    st.records[view.run] = view.to_dict()
            runs_changed = True
        if isinstance(msg.get("skipped"), list):
            st.skipped = [one_line(str(x), 600) for x in msg["skipped"][:100]]
            self.changed("node")
        if isinstance(msg.get("queue"), list):
            st.queue = [e for e in msg["queue"] if isinstance(e, dict)]   # every project's: they share the slots
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
        options: dict[str, float] = {}
        if every is not None:
            options["every"] = every
        if silent is not None:
            options["silent"] = silent
        self.feeds = [NodeFeed(cfg, m, changed, **options) for m in self.group.members]
        self.label = f"{len(cfg.nodes)} node(s)"
        self.drift = DriftWatch(cfg, lambda: [f.member for f in self.feeds if f.state.state == UP],
                                lambda: changed("nodes"))
        self.fabric = FabricWatch(cfg, lambda: [f.member for f in self.feeds if f.state.state == UP],
                                  lambda: changed("nodes"))

    async def start(self) -> None:
        """Connect every node (a host key that is not the pinned one refuses the whole dashboard) and
        start the feeds; a node that cannot be reached is shown down and tried again, it stops nothing."""
        await self.group.connect()
        for f in self.feeds:
            f.start()
        self.drift.start()
        self.fabric.start()

    async def close(self) -> None:
        await self.drift.close()
        await self.fabric.close()
        for f in self.feeds:
            await f.close()
        await self.group.close()

    def runs(self) -> list[RunStatus]:
        """The nodes' records merged as ``higgsfield status`` merges them (a node that is down: its last known)."""
        runs = merge([rec for f in self.feeds for rec in f.state.records.values()])
        self.fabric.seen(s.run for s in runs if s.state == "succeeded")   # a fabric test just ended: its result
        return runs

    def nodes(self) -> list[dict[str, Any]]:
        out = []
        for f in self.feeds:
            d = f.state.to_dict()
            d["queue"] = [{k: e.get(k) for k in ("project", "run", "want", "slots", "committed")}
                          for e in f.state.queue]
            d["drift"] = self.drift.marks(f.state.name)   # the Nodes view marks a drifted node
            d["fabric"] = self.fabric.marks(f.state.name)  # ... and its last fabric figures, a slow one
            out.append(d)
        return out

    def places(self, status: RunStatus) -> dict[str, Any]:
        down = {f.state.name for f in self.feeds if f.state.state != UP}
        queue: dict[str, Any] = {}
        for f in self.feeds:
            if f.state.name in status.nodes:
                place = f.state.positions(self.cfg.name).get(status.run)
                if place is not None:
                    queue[f.state.name] = place
        waiting = [p["position"] for p in queue.values() if p.get("position")]
        return {"stale_nodes": sorted(down & set(status.nodes)), "queue": queue,
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
        for rec in handle.records:
            f = feeds.get(str(rec.get("node")))
            if f is not None and isinstance(rec.get("run"), str):
                f.state.records.setdefault(rec["run"], rec)
        self.changed("runs")

    def poke(self) -> None:
        """Nothing to do: the nodes push every change of their records."""

"""The dashboard's state and actions: every run, every node, and kill / re-run, for every open page.

One hub per ``higgsfield ui``. It connects the project's nodes once
(:class:`~higgsfield.remote.Group`, the same connections for the UI's whole life),
keeps one :class:`~higgsfield.ui.nodes.NodeFeed` per node on them, and merges the
nodes' run records with :func:`higgsfield.orchestrator.merge`, the very function
behind ``higgsfield status``: a run on the page is a
:class:`~higgsfield.runspec.RunStatus` (``status --json``'s schema) plus what only
the page shows (params, each node's queue position and slots).

The actions are the CLI's: kill is :func:`~higgsfield.orchestrator.kill_runs`; a
re-run takes the typed form of the experiment's Actions workflow
(:func:`~higgsfield.workflows.form.form_inputs`), checks it exactly as the workflow's
job does (:func:`~higgsfield.workflows.ci_inputs.run_inputs`), then
:func:`~higgsfield.orchestrator.plan_run` validates it as ``higgsfield run`` does
before :func:`~higgsfield.orchestrator.launch` starts it with the project's secrets
(read on this machine, sent to the nodes over SSH, never to the browser).

Pages subscribe to the hub's events (``runs``, ``nodes``); changes are coalesced
for ``COALESCE_S`` so a burst of node news is one event.

Use::

    hub = Hub(cfg)
    await hub.start()
    q = hub.subscribe(); ...; hub.unsubscribe(q)
    await hub.kill("tiny_llama-20261202-0412-ab12")
    await hub.close()
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from higgsfield import orchestrator
from higgsfield.config import Config
from higgsfield.discovery import DiscoveredExperiment, discover, find_experiment
from higgsfield.errors import RunError
from higgsfield.remote import Group
from higgsfield.runspec import ACTIVE, RunStatus
from higgsfield.ui.nodes import UP, NodeFeed
from higgsfield.ui.runfeed import Event, RunFeed
from higgsfield.workflows.ci_inputs import run_inputs
from higgsfield.workflows.form import form_inputs

COALESCE_S = 0.05
FIND_WAIT_S = 3.0      # a run page opened right after a start elsewhere waits this long for the run to show
SUBSCRIBER_BACKLOG = 64
#: What of a node's record of a run reaches the page (never its command, pids or container details).
NODE_FIELDS = ("state", "slots", "exit_code", "started_at", "ended_at", "reason", "exclusive", "nproc")


class Hub:
    """What every page of one dashboard shows, and what it may do."""

    def __init__(self, cfg: Config, *, sample_every: float | None = None, silent: float | None = None) -> None:
        self.cfg = cfg
        self.group = Group.of(cfg, cfg.nodes)
        options: dict[str, float] = {}
        if sample_every is not None:
            options["every"] = sample_every
        if silent is not None:
            options["silent"] = silent
        self.feeds = [NodeFeed(cfg, m, self._changed, **options) for m in self.group.members]
        self.subscribers: set[asyncio.Queue[Event]] = set()
        self.run_feeds: dict[str, RunFeed] = {}
        self._dirty: set[str] = set()
        self._flush: asyncio.TimerHandle | None = None
        self._experiments: tuple[tuple[tuple[str, float], ...] | None, list[str]] = (None, [])

    # -- life -------------------------------------------------------------------

    async def start(self) -> None:
        """Connect every node (a host key that is not the pinned one refuses the whole dashboard) and
        start the feeds; a node that cannot be reached is shown down and tried again, it stops nothing."""
        await self.group.connect()
        for f in self.feeds:
            f.start()

    async def close(self) -> None:
        for rf in list(self.run_feeds.values()):
            await rf.close()
        for f in self.feeds:
            await f.close()
        for q in list(self.subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(("bye", {}))
        await self.group.close()

    # -- the state ----------------------------------------------------------------

    def runs(self) -> list[RunStatus]:
        """Every run of the project on the nodes, merged as ``higgsfield status`` merges them (oldest first).

        A node that is down contributes its last known records (the page marks them so).
        """
        records = [rec for f in self.feeds for rec in f.state.records.values()]
        return orchestrator.merge(records)

    def find(self, target: str) -> RunStatus:
        return orchestrator.resolve_target(self.runs(), target)[0]

    def run_view(self, status: RunStatus) -> dict[str, Any]:
        """``status --json``'s object for one run, plus params, per-node queue places and slots."""
        out = status.to_dict()
        first = next(iter(status.nodes.values()), {})
        out["params"] = first.get("params") or {}
        out["node_records"] = {n: {k: r.get(k) for k in NODE_FIELDS} for n, r in status.nodes.items()}
        down = {f.state.name for f in self.feeds if f.state.state != UP}
        out["stale_nodes"] = sorted(down & set(status.nodes))
        queue: dict[str, Any] = {}
        for f in self.feeds:
            if f.state.name in status.nodes:
                place = f.state.positions(self.cfg.name).get(status.run)
                if place is not None:
                    queue[f.state.name] = place
        out["queue"] = queue
        waiting = [p["position"] for p in queue.values() if p.get("position")]
        out["queue_position"] = max(waiting) if waiting and status.state in ACTIVE else None
        return out

    def runs_payload(self) -> dict[str, Any]:
        runs = self.runs()
        return {"project": self.cfg.name, "runs": [self.run_view(r) for r in runs],
                "experiments": sorted({r.experiment for r in runs} | set(self.experiment_names()))}

    def nodes_payload(self) -> dict[str, Any]:
        return {"nodes": [self._node_view(f) for f in self.feeds]}

    def _node_view(self, f: NodeFeed) -> dict[str, Any]:
        d = f.state.to_dict()
        d["queue"] = [{k: e.get(k) for k in ("project", "run", "want", "slots", "committed")} for e in f.state.queue]
        return d

    def experiment_names(self) -> list[str]:
        """The experiments under src/ (for "New run"), parsed again only when a file there changed."""
        src = self.cfg.project_dir / "src"
        try:
            key = tuple(sorted((str(p), p.stat().st_mtime) for p in src.rglob("*.py")))
        except OSError:
            key = ()
        if key != self._experiments[0]:
            try:
                names = [e.name for e in discover(src)]
            except Exception:  # noqa: BLE001 - a broken source file must not break the page; the form says why
                names = []
            self._experiments = (key, names)
        return list(self._experiments[1])

    # -- subscribers ----------------------------------------------------------------

    def subscribe(self) -> tuple[asyncio.Queue[Event], list[Event]]:
        """A queue of live events and the current state to send first."""
        q: asyncio.Queue[Event] = asyncio.Queue(maxsize=SUBSCRIBER_BACKLOG)
        self.subscribers.add(q)
        return q, [("runs", self.runs_payload()), ("nodes", self.nodes_payload())]

    def unsubscribe(self, q: asyncio.Queue[Event]) -> None:
        self.subscribers.discard(q)

    def _changed(self, kind: str) -> None:
        self._dirty.add(kind)
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(COALESCE_S, self._send)

    def _send(self) -> None:
        self._flush = None
        dirty, self._dirty = self._dirty, set()
        events: list[Event] = []
        if "runs" in dirty:
            events.append(("runs", self.runs_payload()))
            self._refresh_run_feeds()
        if "node" in dirty or "runs" in dirty:
            events.append(("nodes", self.nodes_payload()))
        for q in list(self.subscribers):
            for ev in events:
                try:
                    q.put_nowait(ev)
                except asyncio.QueueFull:     # a page that does not read: it gets the state again on reconnect
                    self.subscribers.discard(q)
                    break

    # -- a run's page -------------------------------------------------------------------

    def run_feed(self, run: str) -> RunFeed:
        """The shared logs + metrics reader of ``run`` (exactly that run, not an experiment's latest)."""
        feed = self.run_feeds.get(run)
        if feed is None:
            status = next((r for r in self.runs() if r.run == run), None)
            if status is None:
                raise RunError(f"no run named '{run}' (see 'higgsfield status')")
            members = [m for m in self.group.members if m.name in status.nodes]
            feed = RunFeed(self.cfg, Group(members), status, self._drop_feed)
            self.run_feeds[run] = feed
        return feed

    def _drop_feed(self, feed: RunFeed) -> None:
        if self.run_feeds.get(feed.run) is feed:
            del self.run_feeds[feed.run]
            asyncio.get_running_loop().create_task(feed.close())

    def _refresh_run_feeds(self) -> None:
        by_name = {r.run: r for r in self.runs()}
        for name, feed in self.run_feeds.items():
            if name in by_name:
                feed.status = by_name[name]

    # -- actions ------------------------------------------------------------------------

    async def kill(self, run: str) -> list[dict[str, Any]]:
        """``higgsfield kill RUN``, over the dashboard's connections; the killed runs' status."""
        killed = await orchestrator.kill_runs(self.group, self.cfg, run)
        return [k.to_dict() for k in killed]

    def form(self, experiment: str, run: str | None = None) -> dict[str, Any]:
        """The typed form of ``experiment`` (its Actions workflow's), filled from ``run``'s params if given."""
        exp = find_experiment(self.cfg.project_dir / "src", experiment)
        values: Mapping[str, Any] = {}
        if run is not None:
            values = next((r.get("params") or {} for r in
                           (self.run_view(s) for s in self.runs() if s.run == run)), {})
        fields = []
        for i in form_inputs(exp, len(self.cfg.nodes)):
            value = values.get(i.name, i.default)
            fields.append({"name": i.name, "type": i.type, "description": i.description, "required": i.required,
                           "default": i.default, "options": list(i.options) if i.options else None,
                           "value": value})
        return {"experiment": exp.name, "fields": fields}

    def plan(self, experiment: str, values: Mapping[str, Any]) -> orchestrator.RunPlan:
        """Check a submitted form as the workflow's job does, then as ``higgsfield run`` does; raises one line."""
        exp = find_experiment(self.cfg.project_dir / "src", experiment)
        environ = _form_environ(exp, values, len(self.cfg.nodes))
        inputs = run_inputs(exp, environ, len(self.cfg.nodes))
        return orchestrator.plan_run(self.cfg, exp.name, inputs.params, run_name=inputs.run_name,
                                     nodes=inputs.nodes)

    async def start_run(self, experiment: str, values: Mapping[str, Any]) -> dict[str, Any]:
        """Validate and launch a run over the dashboard's connections; its status as the nodes reported it."""
        from higgsfield import secrets

        plan = self.plan(experiment, values)
        handle = await orchestrator.launch(Group(self.group.members[:len(plan.nodes)]), self.cfg, plan,
                                           secrets=secrets.collect(self.cfg))
        self._learn(handle.records)
        return {"run": handle.run, "nodes": handle.nodes}

    def _learn(self, records: list[dict[str, Any]]) -> None:
        """Records a node just answered (a start): known now, before its feed reports them."""
        feeds = {f.state.name: f for f in self.feeds}
        for rec in records:
            f = feeds.get(str(rec.get("node")))
            if f is not None and isinstance(rec.get("run"), str):
                f.state.records.setdefault(rec["run"], rec)
        self._changed("runs")

    async def wait_for_run(self, run: str, timeout: float = FIND_WAIT_S) -> RunFeed:
        """:meth:`run_feed`, allowing a run started elsewhere a moment to reach the feeds."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                return self.run_feed(run)
            except RunError:
                if asyncio.get_running_loop().time() >= deadline:
                    raise
            await asyncio.sleep(0.1)


def _form_environ(exp: DiscoveredExperiment, values: Mapping[str, Any], total_nodes: int) -> dict[str, str]:
    """The page's form values as the environment the Actions job would get (``FormInput.env``), as text.

    A field the page did not send is not passed, as a workflow that lacks it; a
    boolean is ``true``/``false``, numbers their text, as GitHub sends them.
    """
    known = {i.name: i for i in form_inputs(exp, total_nodes)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise RunError(f"experiment '{exp.name}' has no form field '{unknown[0]}'")
    env: dict[str, str] = {}
    for name, value in values.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif value is None:
            text = ""
        elif isinstance(value, (int, float, str)):
            text = str(value)
        else:
            raise RunError(f"form field '{name}' must be text, a number or true/false")
        env[known[name].env] = text
    return env

"""The dashboard's state and actions: every run, every node, and kill / re-run, for every open page.

One hub per ``higgsfield ui``. It watches the project's backend through its
:class:`~higgsfield.control.backends.backend.Fleet` (``Backend.fleet``) for the UI's whole life (the SSH
nodes' pushed feeds, or a Slurm cluster asked through its login node): a run on the page is the
backend's :class:`~higgsfield.contract.runstatus.RunStatus` (``status --json``'s schema) plus what
only the page shows (each node's queue place and slots).

The actions are the CLI's, through the backend (:mod:`higgsfield.control.backends.backend`):
kill is ``Session.kill``, "take stacks now" ``Session.stacks`` (``higgsfield stacks``); a re-run takes the typed form of the experiment's Actions
workflow (:func:`~higgsfield.control.workflows.form.form_inputs`), checks it exactly as the
workflow's job does (:func:`~higgsfield.control.workflows.ci_inputs.run_inputs`), then
``Backend.plan`` validates it as ``higgsfield run`` does before ``Session.start`` starts
(or submits) it with the project's secrets (read on this machine, sent over SSH, never
to the browser). A run's page reads ``Session.logs`` and ``Session.metrics``
(:class:`~higgsfield.control.ui.runfeed.RunFeed`).

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
import dataclasses
import functools
import time
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any

import anyio
import anyio.abc

from higgsfield.contract.errors import RunError
from higgsfield.contract.nodepart import NodePart
from higgsfield.contract.runstatus import RunStatus, status_json
from higgsfield.control.backends import RunRequest, backend_for
from higgsfield.control.backends.backend import Plan
from higgsfield.control.backends.stall import stall_fields
from higgsfield.control.config import Config
from higgsfield.control.project.discovery import DiscoveredExperiment, discover, find_experiment
from higgsfield.control.ui.runfeed import Event, RunFeed
from higgsfield.control.workflows.ci_inputs import form_nodes_when_empty, form_total_nodes, run_inputs
from higgsfield.control.workflows.form import form_inputs

COALESCE_S = 0.05
FIND_WAIT_S = 3.0      # a run page opened right after a start elsewhere waits this long for the run to show
SUBSCRIBER_BACKLOG = 64


class Hub:
    """What every page of one dashboard shows, and what it may do."""

    def __init__(self, cfg: Config, *, sample_every: float | None = None, silent: float | None = None) -> None:
        self.cfg = cfg
        self.backend = backend_for(cfg)
        self.fleet = self.backend.fleet(self._changed, sample_every=sample_every, silent=silent)
        self.subscribers: set[asyncio.Queue[Event]] = set()
        self.run_feeds: dict[str, RunFeed] = {}
        self._dirty: set[str] = set()
        self._flush: asyncio.TimerHandle | None = None
        self._experiments: tuple[tuple[tuple[str, float], ...] | None, list[str]] = (None, [])
        self._stack = AsyncExitStack()
        self._tasks: anyio.abc.TaskGroup | None = None    # the run feeds' reads and closes: they end with the hub

    # -- life -------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and start watching (a host key that is not the pinned one refuses the whole dashboard);
        a node that cannot be reached is shown down and tried again, it stops nothing. :meth:`close` is
        awaited in the same task (the hub's task group is entered here and left there)."""
        self._tasks = await self._stack.enter_async_context(anyio.create_task_group())
        await self.fleet.start()

    async def close(self) -> None:
        for rf in list(self.run_feeds.values()):
            await rf.close()
        await self.fleet.close()
        for q in list(self.subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(("bye", {}))
        if self._tasks is not None:
            self._tasks.cancel_scope.cancel()     # what is left (a dropped feed's close) ends here
        await self._stack.aclose()

    # -- the state ----------------------------------------------------------------

    def runs(self) -> list[RunStatus]:
        """Every run of the project, oldest first, as ``higgsfield status`` shows them (a node or login
        node that is down contributes its last known runs; the page marks them so)."""
        return self.fleet.runs()

    def run_view(self, status: RunStatus) -> dict[str, Any]:
        """``status --json``'s object for one run, plus per-node records, queue places and slots."""
        return {**status_json(status), "node_records": {n: _node_record(p) for n, p in status.nodes.items()},
                **stall_fields(status),      # a stalled run: its diagnosis, shown in the table and on its page
                **self.fleet.places(status)}

    def runs_payload(self) -> dict[str, Any]:
        runs = self.runs()
        return {"project": self.cfg.name, "backend": self.backend.name, "runs": [self.run_view(r) for r in runs],
                "experiments": sorted({r.experiment for r in runs} | set(self.experiment_names()))}

    def nodes_payload(self) -> dict[str, Any]:
        return {"nodes": self.fleet.nodes()}

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
                    with contextlib.suppress(asyncio.QueueFull):   # ... which "reset" makes its stream do
                        q.get_nowait()
                        q.put_nowait(("reset", {}))
                    break

    # -- a run's page -------------------------------------------------------------------

    def run_feed(self, run: str) -> RunFeed:
        """The shared logs + metrics reader of ``run`` (exactly that run, not an experiment's latest)."""
        feed = self.run_feeds.get(run)
        if feed is None:
            status = next((r for r in self.runs() if r.run == run), None)
            if status is None:
                raise RunError(f"no run named '{run}' (see 'higgsfield status')")
            if self._tasks is None:
                raise RunError("the dashboard has not started")
            feed = RunFeed(self.fleet.session(list(status.nodes)), status, self._drop_feed, self._tasks)
            self.run_feeds[run] = feed
        return feed

    def _drop_feed(self, feed: RunFeed) -> None:
        if self.run_feeds.get(feed.run) is feed:
            del self.run_feeds[feed.run]
            if self._tasks is not None:
                self._tasks.start_soon(feed.close, name=f"close-{feed.run}")

    def _refresh_run_feeds(self) -> None:
        by_name = {r.run: r for r in self.runs()}
        for name, feed in self.run_feeds.items():
            if name in by_name:
                feed.status = by_name[name]

    # -- actions ------------------------------------------------------------------------

    async def kill(self, run: str) -> list[dict[str, Any]]:
        """``higgsfield kill RUN``, over the dashboard's connections; the killed runs' status."""
        killed = await self.fleet.session().kill(run)
        self.fleet.poke()
        return [status_json(k) for k in killed]

    async def stacks(self, run: str) -> dict[str, Any]:
        """``higgsfield stacks RUN --json``, over the dashboard's connections, with its diagnosis: every rank's
        stack taken now (a live run) or at its stall (``saved``)."""
        from higgsfield.contract.codec import encode
        from higgsfield.contract.stacks import diagnose

        status = next((r for r in self.runs() if r.run == run), None)
        if status is None:
            raise RunError(f"no run named '{run}' (see 'higgsfield status')")
        found = await self.fleet.session(list(status.nodes)).stacks(status)
        return {"run": run, "saved": found.saved, "stacks": encode(found.stacks),
                "diagnosis": encode(diagnose(found.stacks, silent=list(found.unreachable))),
                "unreachable": dict(found.unreachable)}

    async def profile(self, run: str, steps: int = 3) -> dict[str, Any]:
        """``higgsfield profile RUN --steps N``, over the dashboard's connections: the traces in
        ``./profiles/RUN/TIME/`` of the project, each rank's shares, and where the merged timeline is."""
        from higgsfield.contract.traces import shares_line

        status = next((r for r in self.runs() if r.run == run), None)
        if status is None:
            raise RunError(f"no run named '{run}' (see 'higgsfield status')")
        dest = self.cfg.project_dir / "profiles" / run / time.strftime("%Y%m%d-%H%M%S")
        res = await self.fleet.session(list(status.nodes)).profile(status, steps=steps, dest=dest)
        return {"run": run, "stamp": dest.name, "merged": res.merged is not None, "dir": str(dest),
                "ranks": [f"{r.node}/{r.done.rank}: " + (shares_line(r.summary) if r.summary else
                                                         r.done.error or "no trace") for r in res.ranks],
                "missing": list(res.missing), "unreachable": dict(res.unreachable)}

    def form(self, experiment: str, run: str | None = None) -> dict[str, Any]:
        """The typed form of ``experiment`` (its Actions workflow's), filled from ``run``'s params if given."""
        exp = find_experiment(self.cfg.project_dir / "src", experiment)
        values: Mapping[str, Any] = {}
        if run is not None:
            values = next((s.params for s in self.runs() if s.run == run), {})
        fields = []
        for i in form_inputs(exp, form_nodes_when_empty(self.cfg), self.cfg.stall_timeout):
            value = values.get(i.name, i.default)
            fields.append({"name": i.name, "type": i.type, "description": i.description, "required": i.required,
                           "default": i.default, "options": list(i.options) if i.options else None,
                           "value": value})
        return {"experiment": exp.name, "fields": fields}

    def plan(self, experiment: str, values: Mapping[str, Any]) -> Plan:
        """Check a submitted form as the workflow's job does, then as ``higgsfield run`` does; raises one line."""
        return self.backend.plan(self._request(experiment, values))

    def _request(self, experiment: str, values: Mapping[str, Any]) -> RunRequest:
        exp = find_experiment(self.cfg.project_dir / "src", experiment)
        environ = _form_environ(exp, values)
        inputs = run_inputs(exp, environ, form_total_nodes(self.cfg))
        return RunRequest(exp.name, inputs.params, run_name=inputs.run_name, nodes=inputs.nodes,
                          stall_timeout=inputs.stall_timeout)

    def check(self, experiment: str, values: Mapping[str, Any]) -> dict[str, Any]:
        """What the form's "Check" shows: the typed params and where the run would go."""
        plan = self.plan(experiment, values)
        return {"ok": True, "params": plan.params, "where": self.fleet.where(plan)}

    async def start_run(self, experiment: str, values: Mapping[str, Any]) -> dict[str, Any]:
        """Validate and start (or submit) a run over the dashboard's connections; where it went."""
        from higgsfield.control import secrets

        request = self._request(experiment, values)
        plan = self.backend.plan(request)   # a bad form costs no fabric test
        passed: tuple[str, ...] = ()
        if self.cfg.preflight:   # 'preflight: true' holds for the dashboard's runs as for run's and ci run's
            from higgsfield.control.doctor.preflight import preflight

            # the form has no exclude field: what the preflight leaves out is all it passes over
            passed = (await anyio.to_thread.run_sync(functools.partial(preflight, self.cfg,
                                                                       count=request.nodes))).exclude
            plan = self.backend.plan(dataclasses.replace(request, exclude=passed))
        nodes = [str(n.name) for n in getattr(plan, "nodes", [])] or None
        handle = await self.fleet.session(nodes).start(plan, secrets=secrets.collect(self.cfg))
        self.fleet.learn(handle)
        where = self.backend.describe(handle) + (f" (passed over by the preflight: {', '.join(passed)})"
                                                 if passed else "")
        return {"run": handle.run, "nodes": handle.nodes, "where": where}

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


def _node_record(part: NodePart) -> dict[str, Any]:
    """What of a node's part of a run reaches the page (None: its backend does not know it; never a command,
    pids or a container: a part holds none)."""
    return {"state": part.state, "slots": None if part.slots is None else list(part.slots),
            "exit_code": part.exit_code, "started_at": part.started_at, "ended_at": part.ended_at,
            "reason": part.reason, "exclusive": part.exclusive, "nproc": part.nproc}


def _form_environ(exp: DiscoveredExperiment, values: Mapping[str, Any]) -> dict[str, str]:
    """The page's form values as the environment the Actions job would get (``FormInput.env``), as text.

    A field the page did not send is not passed, as a workflow that lacks it; a
    boolean is ``true``/``false``, numbers their text, as GitHub sends them.
    """
    known = {i.name: i for i in form_inputs(exp)}
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

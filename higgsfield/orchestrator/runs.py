"""Control-side run operations across nodes: start, logs, status, kill.

Every node is driven through its invoker (``higgsfield invoker ...``) over its
Transport, all nodes at once. Params are validated before anything starts; node
ranks follow the order of ``nodes`` in higgsfield.yml; if any node fails to launch,
the nodes that did start are stopped and the error names the failed node.

Whether a run goes on is decided by its nodes, never here (a laptop cannot tell a
node that died from its own network dropping): the nodes' supervisors and the run's
coordinator on node 0 fail it everywhere within seconds when any node's part fails
or a node is lost (:mod:`higgsfield.invoker.coordinator`), with or without a control
side. Following a run (``follow_run``) watches every node's log stream (the node's
invoker sends a heartbeat line every few seconds): a stream that breaks or goes
silent for ``LOST_AFTER_S`` is re-attached, skipping the lines already shown, so
nothing is lost or shown twice; a node whose stream cannot be re-attached once the
others have ended is reported (:class:`NodeLost`), and the run's status says the rest.

Use::

    handle = start_run(cfg, "tiny_llama", {"steps": "50"})
    for line in follow_run(cfg, handle.run): print(line.node, line.rank, line.text)
    runs, _ = list_runs(cfg); kill(cfg, handle.run)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets as _random
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from higgsfield.config import Config, NodeConfig
from higgsfield.discovery import find_experiment
from higgsfield.errors import NodeLost, RunError
from higgsfield.orchestrator._output import UPGRADE_HINT, invoke
from higgsfield.params import check_run_name, resolve
from higgsfield.remote import Group, Member, NodeResult, Transport, open_group, select_nodes
from higgsfield.remote.invoker import invoker_argv, node_state_dir
from higgsfield.runspec import (
    ACTIVE,
    FAILED,
    KILLED,
    QUEUED,
    RUNNING,
    STARTING,
    SUCCEEDED,
    Coordinator,
    RunSpec,
)

HEARTBEAT_S = 5.0
LOST_AFTER_S = 30.0
WATCH_EVERY_S = 0.5     # how often a follower looks for silent or lost streams while lines flow
NOTICE = -2            # the rank of a LogLine that is this side's own notice (a re-attached stream), not a log
REATTACH_TRIES = 3     # attempts at the lost stream of a run's only node (one when other nodes' streams ended)


@dataclass
class RunHandle:
    """A started run: its name and the nodes it runs on (in node-rank order)."""

    project: str
    experiment: str
    run: str
    nodes: list[str]
    records: list[dict[str, Any]] = field(default_factory=list)

    def status(self) -> RunStatus:
        """The run's status as its nodes reported it at start (no extra round trip)."""
        return _merge(self.records)[0]


@dataclass
class RunStatus:
    """One run across nodes."""

    project: str
    experiment: str
    run: str
    state: str
    nodes: dict[str, dict[str, Any]]          # node -> its record
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    failed_node: str | None = None
    failed_rank: int | None = None
    reason: str | None = None
    error_tail: list[str] = field(default_factory=list)   # the last lines of the first failure's error

    @property
    def duration(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at or time.time()) - self.started_at

    def to_dict(self) -> dict[str, Any]:
        return {"project": self.project, "experiment": self.experiment, "run": self.run, "state": self.state,
                "nodes": list(self.nodes), "created_at": self.created_at, "started_at": self.started_at,
                "ended_at": self.ended_at, "duration": self.duration, "exit_code": self.exit_code,
                "failed_node": self.failed_node, "failed_rank": self.failed_rank, "reason": self.reason,
                "error_tail": self.error_tail,
                "node_states": {n: r.get("state") for n, r in self.nodes.items()}}


@dataclass(frozen=True)
class LogLine:
    node: str
    rank: int          # global rank; -1 for the launcher (torchrun) itself, NOTICE for this side's notices
    text: str


def new_run_name(experiment: str) -> str:
    return f"{experiment}-{time.strftime('%Y%m%d-%H%M%S')}-{_random.token_hex(2)}"


def _nproc(cfg: Config, node: NodeConfig) -> int | None:
    """Processes on ``node``: a number, or None for one per GPU (``auto``), which the node works out."""
    n = cfg.node_nproc(node)
    return None if n == "auto" else int(n)


def _code_dir(cfg: Config, node: NodeConfig) -> str:
    if node.is_local:
        return str(cfg.project_dir)
    return f"{node_state_dir(cfg)}/projects/{cfg.name}/code"


def start_run(cfg: Config, experiment: str, params: dict[str, Any], *, run_name: str | None = None,
              nodes: int | None = None, max_restarts: int = 0, secrets: dict[str, str] | None = None,
              exclusive: bool = False) -> RunHandle:
    """Validate, then launch ``experiment`` on the selected nodes at once; returns when all started.

    A node whose slots are busy queues the run there (state ``queued``); it starts by
    itself. This call never follows the run (see :func:`follow_run`).
    """
    return asyncio.run(start_run_async(cfg, experiment, params, run_name=run_name, nodes=nodes,
                                       max_restarts=max_restarts, secrets=secrets, exclusive=exclusive))


async def start_run_async(cfg: Config, experiment: str, params: dict[str, Any], *, run_name: str | None = None,
                          nodes: int | None = None, max_restarts: int = 0,
                          secrets: dict[str, str] | None = None, exclusive: bool = False) -> RunHandle:
    exp = find_experiment(cfg.project_dir / "src", experiment)
    values = resolve(exp.params, params, experiment)
    if run_name is not None:
        check_run_name(run_name)
    if max_restarts < 0:
        raise RunError("--max-restarts must be >= 0")
    run = run_name or new_run_name(experiment)
    selected = select_nodes(cfg, nodes)
    names = [str(n.name) for n in selected]
    token = _random.token_hex(32)  # authenticates the run's nodes to its coordinator; sent on stdin only
    submitted_at = time.time()  # the FIFO order of every node's queue
    async with open_group(cfg, selected) as group:
        master = selected[0]
        master_addr = "127.0.0.1" if master.is_local else master.host

        def launcher(coordinator: Coordinator | None) -> Any:
            async def launch(m: Member) -> dict[str, Any]:
                rank, node, t = m.rank, m.node, m.transport
                spec = RunSpec(
                    project=cfg.name, experiment=experiment, run=run, module=exp.module,
                    code_dir=_code_dir(cfg, node), params=values, node=str(node.name), node_rank=rank,
                    nodes=tuple(names), master_addr=master_addr, submitted_at=submitted_at,
                    nproc=_nproc(cfg, node), coordinator=coordinator, max_restarts=max_restarts,
                    runtime=cfg.runtime, exclusive=exclusive)
                payload = json.dumps({"spec": spec.to_dict(), "secrets": secrets or {}, "token": token})
                return dict(await invoke(t, cfg, ["start"], input=payload, keys=("state", "run")))
            return launch

        # Node 0 first: its start binds the run's coordinator port, which the others are started with.
        timeout = cfg.ssh.connect_timeout + 120
        results = await group[:1].run(launcher(None), timeout=timeout)
        port = results[0].value.get("coord_port") if results[0].ok and results[0].value else None
        if results[0].ok and not port:
            results[0] = NodeResult(names[0], 0, error=RunError(
                f"the invoker on {names[0]} started no run coordinator ({UPGRADE_HINT})"))
        if results[0].ok and len(selected) > 1:
            coordinator = Coordinator(host=master_addr, port=int(port or 0), node=names[0])
            results += await group[1:].run(launcher(coordinator), timeout=timeout)
        failed = [r for r in results if not r.ok]
        if failed:
            # Every node, not only those that answered: one that timed out may have a supervisor running.
            kills = await _kill_on(group, cfg, run, missing_ok=True)
            stopped = [k.node for k in kills if k.ok and k.value and not k.value.get("missing")]
            unkilled = [k for k in kills if not k.ok]
            detail = "; ".join(f"{r.node}: {r.reason}" for r in failed)
            raise RunError(f"run '{run}' failed to start on {len(failed)} node(s): {detail}"
                           + (f" (stopped it on {', '.join(stopped)})" if stopped else "")
                           + (f"; could not stop it on {'; '.join(f'{k.node}: {k.reason}' for k in unkilled)}"
                              f" (run 'higgsfield kill {run}')" if unkilled else ""))
    return RunHandle(cfg.name, experiment, run, names, [r.value for r in results if r.value is not None])


async def _kill_on(group: Group, cfg: Config, run: str, *, missing_ok: bool = False) -> list[NodeResult[Any]]:
    """Kill ``run`` on every node of ``group``; with ``missing_ok`` a node without it answers {"missing": true}."""
    extra = ["--missing-ok"] if missing_ok else []

    async def one(m: Member) -> Any:
        return await invoke(m.transport, cfg, ["kill", "--project", cfg.name, "--run", run, *extra], timeout=60)

    return await group.run(one, timeout=cfg.ssh.connect_timeout + 60)


# -- status -------------------------------------------------------------------

async def _records(cfg: Config) -> tuple[list[dict[str, Any]], list[NodeResult[Any]]]:
    """Every node's run records of this project, plus per-node results (for unreachable nodes)."""
    async with open_group(cfg) as group:
        async def one(m: Member) -> list[dict[str, Any]]:
            return list(await invoke(m.transport, cfg, ["status", "--project", cfg.name], timeout=60, expect=list))

        results = await group.run(one, timeout=cfg.ssh.connect_timeout + 60)
    records = [rec for r in results if r.ok and r.value for rec in r.value]
    return records, results


def _merge(records: list[dict[str, Any]]) -> list[RunStatus]:
    by_run: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by_run.setdefault(rec["run"], []).append(rec)
    out = []
    for run, recs in by_run.items():
        recs.sort(key=lambda r: r["node_rank"])
        states = {r["state"] for r in recs}
        if FAILED in states:
            state = FAILED
        elif KILLED in states:
            state = KILLED
        elif states == {SUCCEEDED}:
            state = SUCCEEDED
        elif QUEUED in states:  # the run cannot make progress until every node started it
            state = QUEUED
        elif RUNNING in states or STARTING in states:
            state = RUNNING if RUNNING in states else STARTING
        else:
            state = sorted(states)[0]
        first = _first_failure(recs) if state == FAILED else None
        failing = next((r for r in recs if first and r["node"] == first.get("failed_node")), None)
        starts = [r["started_at"] for r in recs if r.get("started_at")]
        ends = [r["ended_at"] for r in recs if r.get("ended_at")]
        codes = [r["exit_code"] for r in recs if r.get("exit_code")]
        if failing is not None and failing.get("exit_code"):
            codes.insert(0, failing["exit_code"])  # the run's exit code: the failing node's
        out.append(RunStatus(
            project=recs[0]["project"], experiment=recs[0]["experiment"], run=run, state=state,
            nodes={r["node"]: r for r in recs}, created_at=min(r["created_at"] for r in recs),
            started_at=min(starts) if starts else None,
            ended_at=max(ends) if ends and state not in ACTIVE else None,
            exit_code=codes[0] if codes else (0 if state == SUCCEEDED else None),
            failed_node=first.get("failed_node") if first else None,
            failed_rank=first.get("failed_rank") if first else None,
            reason=first.get("reason") if first else None,
            error_tail=list(first.get("error_tail") or []) if first else []))
    return sorted(out, key=lambda s: s.created_at)


def _first_failure(recs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The record that names the run's first failure: every node records the coordinator's verdict,
    so they agree; when they do not (a node cut off), the earliest failure wins."""
    failed = [r for r in recs if r["state"] == FAILED]
    if not failed:
        return None
    named = [r for r in failed if r.get("failed_node")]
    if named:
        return min(named, key=lambda r: (r.get("failed_at") is None, r.get("failed_at") or 0.0))
    return {**failed[0], "failed_node": failed[0]["node"]}


def list_runs(cfg: Config) -> tuple[list[RunStatus], list[NodeResult[Any]]]:
    """All runs of the project across nodes (oldest first), and the per-node query results."""
    records, results = asyncio.run(_records(cfg))
    return _merge(records), results


def resolve_target(runs: list[RunStatus], target: str) -> list[RunStatus]:
    """The run named by ``target``: a run name, or an experiment (its latest run)."""
    exact = [r for r in runs if r.run == target]
    if exact:
        return exact
    of_exp = [r for r in runs if r.experiment == target]
    if not of_exp:
        raise RunError(f"no run or experiment named '{target}' (see 'higgsfield status')")
    return [of_exp[-1]]


def get_run(cfg: Config, target: str) -> RunStatus:
    runs, _ = list_runs(cfg)
    return resolve_target(runs, target)[0]


# -- logs ---------------------------------------------------------------------

async def stream_logs(cfg: Config, status: RunStatus, *, follow: bool = False, node: str | None = None,
                      ranks: tuple[int, ...] = (), lost_after: float | None = None,
                      since: float | None = None) -> AsyncIterator[LogLine]:
    """Merge every node's per-rank lines as they arrive; ends when every node's stream ends.

    ``since`` (a UNIX time of this machine's clock) is passed to every node as is:
    only lines written from then on by the node's clock (``higgsfield doctor``
    reports the skew); see :mod:`higgsfield.invoker.logs`.

    Within a rank lines keep their order. A node whose logs cannot be read is
    reported after the other nodes' lines (RunError naming it). With ``lost_after``
    (following only), a node's stream that breaks or sends nothing, not even a
    heartbeat, for that many seconds is re-attached (a ``NOTICE`` line says so): the
    node sends its logs again from the start and the lines already given are
    skipped, rank by rank, so none is lost or repeated. Once every other stream has
    ended, a stream that still cannot be re-attached raises :class:`NodeLost`.
    """
    nodes = [cfg.node(n) for n in status.nodes if node is None or n == node or cfg.node(n).host == node]
    if not nodes:
        raise RunError(f"run '{status.run}' does not run on node '{node}' (nodes: {', '.join(status.nodes)})")
    watch = bool(follow and lost_after)
    queue: asyncio.Queue[LogLine | tuple[str, int, BaseException | None]] = asyncio.Queue(maxsize=10000)
    last_seen: dict[str, float] = {}
    given: dict[str, dict[int, int]] = {}   # node -> rank -> lines yielded (what a re-attached stream skips)
    generation: dict[str, int] = {}
    async with open_group(cfg, nodes) as group:
        by_node = {t.node: t for t in group.transports}

        async def pump(t: Transport, gen: int) -> None:
            n = cfg.node(t.node)
            args = ["logs", "--project", cfg.name, "--run", status.run]
            args += ["--follow"] if follow else []
            args += ["--heartbeat", str(HEARTBEAT_S)] if watch else []
            args += ["--since", f"{since:.3f}"] if since is not None else []
            for r in ranks:
                args += ["--rank", str(r)]
            seen = given.setdefault(t.node, {})
            skip = dict(seen)
            error: BaseException | None = None
            try:
                last_seen[t.node] = time.monotonic()
                async for raw in t.stream([*invoker_argv(cfg, n), *args]):
                    last_seen[t.node] = time.monotonic()
                    if raw == "#hb":
                        continue
                    head, _, text = raw.partition("\t")
                    rank = int(head) if head.lstrip("-").isdigit() else -1
                    if skip.get(rank, 0) > 0:
                        skip[rank] -= 1
                        continue
                    seen[rank] = seen.get(rank, 0) + 1
                    await queue.put(LogLine(t.node, rank, text))
            except Exception as e:  # noqa: BLE001 - surfaced to the reader
                error = e
            finally:
                await queue.put((t.node, gen, error))

        def attach(name: str) -> asyncio.Task[None]:
            generation[name] = generation.get(name, 0) + 1
            return asyncio.create_task(pump(by_node[name], generation[name]))

        tasks = {t.node: attach(t.node) for t in group.transports}
        open_nodes = set(tasks)
        errors: dict[str, BaseException] = {}
        retry_at: dict[str, float] = {}
        tries: dict[str, int] = {}
        next_check = 0.0
        try:
            while open_nodes:
                # A line already queued is taken without a timer: wait_for costs about 20 us a line,
                # which capped a busy follower at a third of its speed.
                if not queue.empty():
                    item = queue.get_nowait()
                elif watch:
                    try:
                        item = await asyncio.wait_for(queue.get(), 1.0)
                    except asyncio.TimeoutError:
                        item = None
                else:
                    item = await queue.get()
                if isinstance(item, LogLine):
                    tries.pop(item.node, None)
                    yield item
                elif item is not None:
                    name, gen, err = item
                    if gen != generation.get(name):
                        pass   # a stream already given up for silence
                    elif err is None:
                        open_nodes.discard(name)
                    elif watch:
                        retry_at[name] = time.monotonic() + min(5.0, 2.0 ** tries.get(name, 0))
                        errors[name] = err
                        yield LogLine(name, NOTICE, f"lost the log stream ({_why(err)}); re-attaching")
                    else:
                        open_nodes.discard(name)
                        errors[name] = err
                if watch:
                    now = time.monotonic()
                    if isinstance(item, LogLine) and now < next_check:
                        continue  # the silence checks below need not run for every line of a busy stream
                    next_check = now + WATCH_EVERY_S
                    for name in sorted(open_nodes):
                        if name not in retry_at and now - last_seen.get(name, now) > float(lost_after or 0):
                            tasks[name].cancel()
                            generation[name] += 1
                            errors[name] = RunError(f"no answer for {now - last_seen[name]:.0f}s")
                            retry_at[name] = now
                            yield LogLine(name, NOTICE, f"no answer for {now - last_seen[name]:.0f}s; re-attaching")
                        # Once every other stream has ended the run is over there, so over here too (its
                        # nodes saw to it): one last try for this node's lines, at once, unless it runs alone.
                        others_done = set(retry_at) >= open_nodes
                        if name in retry_at and (now >= retry_at[name] or others_done and len(by_node) > 1):
                            if others_done:
                                tries[name] = tries.get(name, 0) + 1
                                if tries[name] > (1 if len(by_node) > 1 else REATTACH_TRIES):
                                    raise NodeLost(name, _why(errors[name]), status.run)
                            del retry_at[name]
                            last_seen[name] = now
                            tasks[name] = attach(name)
        finally:
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
        if errors and not watch:
            detail = "; ".join(f"{n}: {_why(e)}" for n, e in errors.items())
            raise RunError(f"could not read the logs of run '{status.run}' on {len(errors)} node(s): {detail}")


def _why(e: BaseException) -> str:
    reason = getattr(e, "reason", None)
    return str(reason or e) or type(e).__name__


def _sync(make: Any) -> Iterator[Any]:
    """Drive the async iterator ``make()`` in its own event loop in a thread, yielding its items here.

    When the consumer stops early (an exception, ``break``, Ctrl-C, or the generator
    being closed), the async side is cancelled from here, thread-safely, so its SSH
    streams close and the thread ends; every wait on either side is bounded, so
    neither can hang on the other.
    """
    import queue as _queue

    q: _queue.Queue[Any] = _queue.Queue(maxsize=10000)
    done = object()
    stop = threading.Event()
    loop_box: dict[str, Any] = {}

    def put(item: Any) -> None:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.2)
                return
            except _queue.Full:
                continue

    async def consume() -> None:
        loop_box["loop"] = asyncio.get_running_loop()
        loop_box["task"] = asyncio.current_task()
        if stop.is_set():
            return
        async with contextlib.aclosing(make()) as items:
            async for item in items:
                if stop.is_set():
                    return
                # a full queue means a slow consumer: wait without blocking the loop
                while not stop.is_set():
                    try:
                        q.put_nowait(item)
                        break
                    except _queue.Full:
                        await asyncio.sleep(0.05)

    def worker() -> None:
        try:
            asyncio.run(consume())
        except asyncio.CancelledError:
            pass
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            put(e)
        finally:
            put(done)

    thread = threading.Thread(target=worker, daemon=True, name="higgsfield-logs")
    thread.start()
    try:
        while True:
            try:
                item = q.get(timeout=0.5)
            except _queue.Empty:
                if not thread.is_alive() and q.empty():
                    return
                continue
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        loop, task = loop_box.get("loop"), loop_box.get("task")
        if loop is not None and task is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                loop.call_soon_threadsafe(task.cancel)
        thread.join(timeout=10)


def iter_logs(cfg: Config, status: RunStatus, **kw: Any) -> Iterator[LogLine]:
    """Synchronous wrapper around :func:`stream_logs` (runs its own event loop in a thread)."""
    return _sync(lambda: stream_logs(cfg, status, **kw))


async def follow_run_async(cfg: Config, status: RunStatus, *, lost_after: float = LOST_AFTER_S,
                           **kw: Any) -> AsyncIterator[LogLine]:
    """Follow a run's logs to its end, re-attaching a node's stream that breaks (the nodes decide the run)."""
    async for line in stream_logs(cfg, status, follow=True, lost_after=lost_after, **kw):
        yield line


def follow_run(cfg: Config, target: str | RunStatus, **kw: Any) -> Iterator[LogLine]:
    """Synchronous :func:`follow_run_async` for a run name (or status): lines until the run ends."""
    status = target if isinstance(target, RunStatus) else get_run(cfg, target)
    return _sync(lambda: follow_run_async(cfg, status, **kw))


# -- kill ---------------------------------------------------------------------

def kill(cfg: Config, target: str) -> list[RunStatus]:
    """Stop every active run named by ``target`` (a run, else an experiment's active runs) on every node.

    One call per node, all nodes at once: each node finds the matching runs itself and
    stops them within a few seconds (SIGTERM, then SIGKILL; ``docker stop`` for
    containers); a queued run leaves the queue. Kill takes no lock that a run, deploy
    or another kill holds, so it never waits behind one. Returns the killed runs'
    final status; raises GroupError (after stopping the rest) if a node can't be reached.
    """
    async def go() -> list[NodeResult[Any]]:
        async with open_group(cfg) as group:
            return await group.run(lambda m: invoke(m.transport, cfg,
                                                     ["kill", "--project", cfg.name, "--target", target],
                                                     timeout=60, keys=("matched", "killed")),
                                   timeout=cfg.ssh.connect_timeout + 60)

    results = asyncio.run(go())
    records = [rec for r in results if r.ok and r.value for rec in r.value.get("killed", [])]
    matched = sum(int(r.value.get("matched", 0)) for r in results if r.ok and r.value)
    failed = [r for r in results if not r.ok]
    if not records:
        if failed:
            Group.check(results, f"kill {target}")
        if matched:
            raise RunError(f"'{target}' has no queued or running run (see 'higgsfield status')")
        raise RunError(f"no run or experiment named '{target}' (see 'higgsfield status')")
    if failed:
        Group.check(results, f"kill {target} (stopped on {len(results) - len(failed)} node(s))")
    return _merge(records)

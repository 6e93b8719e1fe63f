"""Control-side run operations across nodes: start, logs, status, kill.

Every node is driven through its invoker (``higgsfield invoker ...``) over its
Transport, all nodes at once. Params are validated before anything starts; node
ranks follow the order of ``nodes`` in higgsfield.yml; if any node fails to launch,
the nodes that did start are stopped and the error names the failed node.

Use::

    handle = start_run(cfg, "tiny_llama", {"steps": "50"})
    for line in iter_logs(cfg, handle.run, follow=True): print(line.node, line.rank, line.text)
    runs = list_runs(cfg); kill(cfg, handle.run)
"""

from __future__ import annotations

import asyncio
import json
import secrets as _random
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from higgsfield.config import Config, NodeConfig
from higgsfield.discovery import find_experiment
from higgsfield.errors import RunError
from higgsfield.invoker.records import ACTIVE, FAILED, KILLED, QUEUED, RUN_NAME_RE, RUNNING, STARTING, SUCCEEDED
from higgsfield.params import resolve
from higgsfield.remote import Group, NodeResult, Transport, open_group
from higgsfield.remote.invoker import invoker_argv, node_state_dir


@dataclass
class RunHandle:
    """A started run: its name and the nodes it runs on (in node-rank order)."""

    project: str
    experiment: str
    run: str
    nodes: list[str]
    records: list[dict[str, Any]] = field(default_factory=list)


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

    @property
    def duration(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at or time.time()) - self.started_at

    def to_dict(self) -> dict[str, Any]:
        return {"project": self.project, "experiment": self.experiment, "run": self.run, "state": self.state,
                "nodes": list(self.nodes), "created_at": self.created_at, "started_at": self.started_at,
                "ended_at": self.ended_at, "duration": self.duration, "exit_code": self.exit_code,
                "failed_node": self.failed_node, "failed_rank": self.failed_rank}


@dataclass(frozen=True)
class LogLine:
    node: str
    rank: int          # global rank; -1 for the launcher (torchrun) itself
    text: str


def new_run_name(experiment: str) -> str:
    return f"{experiment}-{time.strftime('%Y%m%d-%H%M%S')}-{_random.token_hex(2)}"


def _select_nodes(cfg: Config, count: int | None) -> list[NodeConfig]:
    if count is None:
        return list(cfg.nodes)
    if not 1 <= count <= len(cfg.nodes):
        raise RunError(f"--nodes {count}: the project has {len(cfg.nodes)} node(s) in {cfg.path}")
    return list(cfg.nodes[:count])


def _code_dir(cfg: Config, node: NodeConfig) -> str:
    if node.is_local:
        return str(cfg.project_dir)
    return f"{node_state_dir(cfg, node)}/projects/{cfg.name}/code"


async def _invoke(t: Transport, cfg: Config, node: NodeConfig, args: list[str], *,
                  input: str | None = None, timeout: float | None = None) -> Any:
    res = await t.run([*invoker_argv(cfg, node), *args], input=input,
                      timeout=timeout or cfg.ssh.command_timeout)
    return json.loads(res.stdout)


def start_run(cfg: Config, experiment: str, params: dict[str, Any], *, run_name: str | None = None,
              nodes: int | None = None, max_restarts: int = 0, secrets: dict[str, str] | None = None,
              detach: bool = True) -> RunHandle:
    """Validate, then launch ``experiment`` on the selected nodes at once; returns when all started."""
    return asyncio.run(start_run_async(cfg, experiment, params, run_name=run_name, nodes=nodes,
                                       max_restarts=max_restarts, secrets=secrets))


async def start_run_async(cfg: Config, experiment: str, params: dict[str, Any], *, run_name: str | None = None,
                          nodes: int | None = None, max_restarts: int = 0,
                          secrets: dict[str, str] | None = None) -> RunHandle:
    exp = find_experiment(cfg.project_dir / "src", experiment)
    values = resolve(exp.params, params, experiment)
    if run_name is not None and not RUN_NAME_RE.match(run_name):
        raise RunError(f"--run-name {run_name!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a "
                       "letter or digit")
    if max_restarts < 0:
        raise RunError("--max-restarts must be >= 0")
    run = run_name or new_run_name(experiment)
    selected = _select_nodes(cfg, nodes)
    module = exp.module
    async with open_group(cfg, selected) as group:
        master = selected[0]
        port = (await _invoke(group.transports[0], cfg, master, ["free-port"]))["port"]
        master_addr = "127.0.0.1" if master.is_local else master.host

        async def launch(t: Transport) -> dict[str, Any]:
            rank = group.transports.index(t)
            node = selected[rank]
            spec = {
                "project": cfg.name, "experiment": experiment, "run": run, "module": module,
                "code_dir": _code_dir(cfg, node), "src_dir": "src", "params": values,
                "node": str(node.name), "node_rank": rank, "nnodes": len(selected),
                "nproc": cfg.node_nproc(node), "master_addr": master_addr, "master_port": port,
                "max_restarts": max_restarts, "runtime": cfg.runtime,
            }
            payload = json.dumps({"spec": spec, "secrets": secrets or {}})
            return dict(await _invoke(t, cfg, node, ["start"], input=payload))

        results = await group.run(launch)
        failed = [r for r in results if not r.ok]
        if failed:
            started = [r for r in results if r.ok]
            await _kill_on(group, cfg, selected, [r.node for r in started], run)
            detail = "; ".join(f"{r.node}: {r.reason}" for r in failed)
            raise RunError(f"run '{run}' failed to start on {len(failed)} node(s): {detail}"
                           + (f" (stopped it on {', '.join(r.node for r in started)})" if started else ""))
    return RunHandle(cfg.name, experiment, run, [str(n.name) for n in selected],
                     [r.value for r in results if r.value is not None])


async def _kill_on(group: Group, cfg: Config, nodes: list[NodeConfig], names: list[str], run: str) -> None:
    by_name = {str(n.name): n for n in nodes}

    async def one(t: Transport) -> Any:
        if t.node not in names:
            return None
        return await _invoke(t, cfg, by_name[t.node], ["kill", "--project", cfg.name, "--run", run])

    await group.run(one)


# -- status -------------------------------------------------------------------

async def _records(cfg: Config) -> tuple[list[dict[str, Any]], list[NodeResult[Any]]]:
    """Every node's run records of this project, plus per-node results (for unreachable nodes)."""
    async with open_group(cfg) as group:
        async def one(t: Transport) -> list[dict[str, Any]]:
            node = cfg.node(t.node)
            return list(await _invoke(t, cfg, node, ["status", "--project", cfg.name], timeout=60))

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
        elif RUNNING in states or STARTING in states:
            state = RUNNING if RUNNING in states else STARTING
        elif QUEUED in states:
            state = QUEUED
        else:
            state = sorted(states)[0]
        failures = [r for r in recs if r.get("failed_rank") is not None]
        first = min(failures, key=lambda r: r.get("failed_at") or 0) if failures else None
        if first is None:
            first = next((r for r in recs if r["state"] == FAILED), None)
        starts = [r["started_at"] for r in recs if r.get("started_at")]
        ends = [r["ended_at"] for r in recs if r.get("ended_at")]
        codes = [r["exit_code"] for r in recs if r.get("exit_code")]
        out.append(RunStatus(
            project=recs[0]["project"], experiment=recs[0]["experiment"], run=run, state=state,
            nodes={r["node"]: r for r in recs}, created_at=min(r["created_at"] for r in recs),
            started_at=min(starts) if starts else None,
            ended_at=max(ends) if ends and state not in ACTIVE else None,
            exit_code=codes[0] if codes else (0 if state == SUCCEEDED else None),
            failed_node=first["node"] if first else None,
            failed_rank=first.get("failed_rank") if first else None))
    return sorted(out, key=lambda s: s.created_at)


def list_runs(cfg: Config) -> tuple[list[RunStatus], list[NodeResult[Any]]]:
    """All runs of the project across nodes (oldest first), and the per-node query results."""
    records, results = asyncio.run(_records(cfg))
    return _merge(records), results


def resolve_target(runs: list[RunStatus], target: str, *, active_only: bool = False) -> list[RunStatus]:
    """Runs named by ``target``: a run name, or an experiment (its latest run, or all active ones)."""
    exact = [r for r in runs if r.run == target]
    if exact:
        return exact
    of_exp = [r for r in runs if r.experiment == target]
    if not of_exp:
        raise RunError(f"no run or experiment named '{target}' (see 'higgsfield status')")
    if active_only:
        return [r for r in of_exp if r.state in ACTIVE]
    return [of_exp[-1]]


def get_run(cfg: Config, target: str) -> RunStatus:
    runs, _ = list_runs(cfg)
    return resolve_target(runs, target)[0]


# -- logs ---------------------------------------------------------------------

async def stream_logs(cfg: Config, status: RunStatus, *, follow: bool = False, node: str | None = None,
                      ranks: tuple[int, ...] = ()) -> AsyncIterator[LogLine]:
    """Merge every node's per-rank lines as they arrive; ends when every node's stream ends."""
    nodes = [cfg.node(n) for n in status.nodes if node is None or n == node or cfg.node(n).host == node]
    if not nodes:
        raise RunError(f"run '{status.run}' does not run on node '{node}' (nodes: {', '.join(status.nodes)})")
    queue: asyncio.Queue[LogLine | BaseException | None] = asyncio.Queue(maxsize=10000)
    async with open_group(cfg, nodes) as group:
        async def pump(t: Transport) -> None:
            n = cfg.node(t.node)
            args = ["logs", "--project", cfg.name, "--run", status.run]
            args += ["--follow"] if follow else []
            for r in ranks:
                args += ["--rank", str(r)]
            try:
                async for raw in t.stream([*invoker_argv(cfg, n), *args]):
                    rank, _, text = raw.partition("\t")
                    await queue.put(LogLine(t.node, int(rank) if rank.lstrip("-").isdigit() else -1, text))
            except Exception as e:  # noqa: BLE001 - surfaced to the reader
                await queue.put(e)
            finally:
                await queue.put(None)

        tasks = [asyncio.create_task(pump(t)) for t in group.transports]
        remaining = len(tasks)
        try:
            while remaining:
                item = await queue.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def iter_logs(cfg: Config, status: RunStatus, **kw: Any) -> Iterator[LogLine]:
    """Synchronous wrapper around :func:`stream_logs` (runs its own event loop in a thread)."""
    import queue as _queue
    import threading

    q: _queue.Queue[LogLine | BaseException | None] = _queue.Queue(maxsize=10000)

    async def consume() -> None:
        async for line in stream_logs(cfg, status, **kw):
            q.put(line)

    def worker() -> None:
        try:
            asyncio.run(consume())
        except BaseException as e:  # noqa: BLE001
            q.put(e)
        finally:
            q.put(None)

    threading.Thread(target=worker, daemon=True).start()
    while True:
        item = q.get()
        if item is None:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


# -- kill ---------------------------------------------------------------------

def kill(cfg: Config, target: str) -> list[RunStatus]:
    """Stop every active run named by ``target`` on every node; returns their final status."""
    runs, _ = list_runs(cfg)
    chosen = resolve_target(runs, target, active_only=True)
    if not chosen:
        raise RunError(f"'{target}' has no queued or running run (see 'higgsfield status')")

    async def go() -> None:
        for st in chosen:
            nodes = [cfg.node(n) for n in st.nodes]
            async with open_group(cfg, nodes) as group:
                res = await group.run(lambda t, st=st: _invoke(
                    t, cfg, cfg.node(t.node), ["kill", "--project", cfg.name, "--run", st.run]),
                    timeout=cfg.ssh.connect_timeout + 30)
                Group.check(res, f"kill {st.run}")

    asyncio.run(go())
    after, _ = list_runs(cfg)
    names = {r.run for r in chosen}
    return [r for r in after if r.run in names]

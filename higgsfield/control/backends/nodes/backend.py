"""The SSH nodes of higgsfield.yml as a :class:`~higgsfield.control.backends.backend.Backend`.

A thin wrapper: every call is one of the orchestrator's own functions over one
connected :class:`~higgsfield.control.remote.Group`, so the SSH path stays exactly what it was.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from higgsfield.contract.errors import ConfigError
from higgsfield.contract.runspec import RunStatus
from higgsfield.control.backends.backend import Plan, RunList, RunRequest
from higgsfield.control.backends.nodes.connect import connect
from higgsfield.control.backends.nodes.deploy import DeployResult, deploy
from higgsfield.control.backends.nodes.kill import kill_runs
from higgsfield.control.backends.nodes.logs import LOST_AFTER_S, LogLine, follow, stream_logs
from higgsfield.control.backends.nodes.metrics import read_metrics
from higgsfield.control.backends.nodes.start import RunHandle, RunPlan, launch, plan_run
from higgsfield.control.backends.nodes.status import final_status, find_run, merge, query_runs, skipped_lines
from higgsfield.control.config import Config
from higgsfield.control.remote import Group
from higgsfield.metrics import MetricsItem


class NodesSession:
    def __init__(self, cfg: Config, group: Group) -> None:
        self.cfg, self.group = cfg, group

    async def start(self, plan: RunPlan, secrets: Mapping[str, str] | None = None) -> RunHandle:
        return await launch(self.group, self.cfg, plan, secrets=dict(secrets or {}))

    def follow(self, handle: RunHandle) -> AsyncIterator[LogLine]:
        return follow(self.group, self.cfg, merge(handle.records)[0])

    async def final_status(self, run: str) -> RunStatus:
        return await final_status(self.group, self.cfg, run)

    async def runs(self) -> RunList:
        runs, results = await query_runs(self.group, self.cfg)
        return RunList(runs, {r.node: r.reason for r in results if not r.ok}, skipped_lines(results))

    async def find(self, target: str) -> RunStatus:
        return await find_run(self.group, self.cfg, target)

    def logs(self, status: RunStatus, *, follow: bool = False, node: str | None = None,
             ranks: tuple[int, ...] = (), since: float | None = None) -> AsyncIterator[LogLine]:
        return stream_logs(self.group, self.cfg, status, follow=follow, node=node, ranks=ranks, since=since,
                           lost_after=LOST_AFTER_S if follow else None)

    def metrics(self, status: RunStatus, *, follow: bool = False) -> AsyncIterator[MetricsItem]:
        return read_metrics(self.group, self.cfg, status, follow=follow)

    async def kill(self, target: str) -> list[RunStatus]:
        return await kill_runs(self.group, self.cfg, target)


class NodesBackend:
    name = "nodes"

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def plan(self, request: RunRequest) -> RunPlan:
        for flag, value in (("--time", request.time), ("--partition", request.partition)):
            if value is not None:
                raise ConfigError(f"{flag} is for a Slurm cluster: {self.cfg.path or 'higgsfield.yml'} has no "
                                  "slurm block (this project runs on its SSH nodes)")
        return plan_run(self.cfg, request.experiment, dict(request.params), run_name=request.run_name,
                        nodes=request.nodes, max_restarts=request.max_restarts, exclusive=request.exclusive)

    @asynccontextmanager
    async def session(self, plan: Plan | None = None) -> AsyncIterator[NodesSession]:
        nodes = plan.nodes if isinstance(plan, RunPlan) else None
        async with connect(self.cfg, nodes) as group:
            yield NodesSession(self.cfg, group)

    def deploy(self, *, dirty: bool = False, console: Any = None) -> DeployResult:
        return deploy(self.cfg, dirty=dirty, console=console)

    def describe(self, handle: RunHandle) -> str:
        return f"on {', '.join(handle.nodes)}"

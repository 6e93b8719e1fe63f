"""The SSH nodes, connected, for one command: the :class:`~higgsfield.control.backends.backend.Session` of
:class:`~higgsfield.control.backends.nodes.backend.NodesBackend` (and of the dashboard's
:class:`~higgsfield.control.backends.nodes.fleet.NodesFleet`, over the connections it holds).

Every call is a function of :mod:`higgsfield.control.backends.nodes` over one connected
:class:`~higgsfield.control.remote.Group`: ``start`` is :mod:`.drift`'s ``admit`` (the nodes checked and
picked), then :mod:`.start`'s ``launch``; the others are :mod:`.status`, :mod:`.logs`, :mod:`.metrics`,
:mod:`.kill` and :mod:`.stacks`. ``doctor --fabric`` runs its benchmark through one too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from higgsfield.contract.runstatus import RunStatus
from higgsfield.control.backends.backend import RunList, StacksResult
from higgsfield.control.backends.nodes.drift import admit
from higgsfield.control.backends.nodes.kill import kill_runs
from higgsfield.control.backends.nodes.logs import LOST_AFTER_S, LogLine, follow, stream_logs
from higgsfield.control.backends.nodes.metrics import read_metrics
from higgsfield.control.backends.nodes.profile import ProfileResult, profile_group
from higgsfield.control.backends.nodes.stacks import take_stacks
from higgsfield.control.backends.nodes.start import RunHandle, RunPlan, launch
from higgsfield.control.backends.nodes.status import final_status, find_run, merge, query_runs, skipped_lines
from higgsfield.control.config import Config
from higgsfield.control.remote import Group
from higgsfield.metrics import MetricsItem


class NodesSession:
    def __init__(self, cfg: Config, group: Group) -> None:
        self.cfg, self.group = cfg, group

    async def start(self, plan: RunPlan, secrets: Mapping[str, str] | None = None) -> RunHandle:
        """Check the candidates (drift, reachable), keep the picked nodes as this session's, launch there."""
        self.group, plan, notes = await admit(self.group, self.cfg, plan)
        handle = await launch(self.group, self.cfg, plan, secrets=dict(secrets or {}))
        handle.notes[:0] = notes
        return handle

    def follow(self, handle: RunHandle) -> AsyncIterator[LogLine]:
        return follow(self.group, self.cfg, merge(handle.records)[0], current=True)   # this start's lines only

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

    async def stacks(self, status: RunStatus, *, node: str | None = None, rank: int | None = None) -> StacksResult:
        return await take_stacks(self.group, self.cfg, status, node=node, rank=rank)

    async def profile(self, status: RunStatus, *, steps: int = 3, dest: Path | None = None) -> ProfileResult:
        return await profile_group(self.group, self.cfg, status, steps=steps, dest=dest)

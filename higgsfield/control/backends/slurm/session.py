"""The login node, connected, for one command: a Slurm run's start, status, logs, metrics, stacks and kill.

:class:`SlurmSession` is the Slurm backend's :class:`~higgsfield.control.backends.backend.Session`
(opened by :meth:`~higgsfield.control.backends.slurm.backend.SlurmBackend.session`, the
dashboard's :class:`~higgsfield.control.backends.slurm.fleet.ClusterFleet` holds one for its
whole life); :class:`SlurmPlan` is its checked run. How a run lives on the cluster:
:mod:`higgsfield.control.backends.slurm.backend`.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from higgsfield.contract.codec import decode
from higgsfield.contract.decode import DecodeError, loads
from higgsfield.contract.errors import NoSuchRun, RunError
from higgsfield.contract.layout import code_dir, env_record, node_of_rank
from higgsfield.contract.replies import EnvReply
from higgsfield.contract.runspec import DEFAULT_MAX_RECOVERIES
from higgsfield.contract.runstatus import RunStatus
from higgsfield.contract.stacks import RankStacks
from higgsfield.contract.stall_policy import StallPolicy
from higgsfield.contract.states import ACTIVE, QUEUED
from higgsfield.control.backends.backend import RunList, StacksResult
from higgsfield.control.backends.nodes.logs import LogLine
from higgsfield.control.backends.nodes.metrics import parse_metrics
from higgsfield.control.backends.nodes.start import RunHandle
from higgsfield.control.backends.nodes.status import resolve_target
from higgsfield.control.backends.slurm import ClusterNode, SlurmCluster, template_spec
from higgsfield.control.backends.timeouts import FINAL_POLL_S, FINAL_WAIT_S
from higgsfield.control.config import Config
from higgsfield.control.config.slurm import SlurmConfig
from higgsfield.control.remote import Transport
from higgsfield.metrics import MetricsItem

LAUNCHER_NODE = "slurm"   # the node tag of the job's own output (the batch step, srun, every torchrun)
QUEUED_POLL_S = 1.0       # how often a follower asks Slurm while the job waits for its nodes
WATCH_S = 5.0             # how often a follower checks that Slurm still runs the job it follows
ENDED_GRACE_S = 10.0      # a stream still open this long after Slurm ended the job is closed


@dataclass(frozen=True)
class SlurmPlan:
    """A run checked for the cluster: its params resolved, the job's settings with the run's overrides."""

    experiment: str
    module: str
    params: dict[str, Any]
    run: str
    max_restarts: int
    settings: SlurmConfig
    stall: StallPolicy = StallPolicy()
    allow_drift: bool = False
    """``run --allow-drift``: the job's own drift check (its nodes compared before torchrun) reports and goes on."""
    min_nodes: int = 0
    """``run --min-nodes``: after a lost node, the requeued job may start on as few (0: the full size)."""
    max_recoveries: int = DEFAULT_MAX_RECOVERIES
    """``run --max-recoveries``: lost nodes the job is requeued without before the run fails (0: none)."""


class SlurmSession:
    """The login node, connected, for one command."""

    def __init__(self, cfg: Config, settings: SlurmConfig, transport: Transport) -> None:
        self.cfg, self.settings, self.transport = cfg, settings, transport
        self.cluster = SlurmCluster(transport, settings)   # its interpreter is the invoker's: it reads the logs

    # -- start ------------------------------------------------------------------------------

    async def _deployed(self) -> tuple[str, str | None]:
        """(the release ``code`` points at now, the project environment's python): what a run starts with."""
        workdir = self.settings.workdir
        t = self.transport
        code = await t.run(["readlink", "-e", posixpath.join(workdir, code_dir(self.cfg.name))], check=False)
        if not code.ok or not code.stdout.strip():
            raise RunError(f"project '{self.cfg.name}' is not deployed in {self.settings.workdir} on {t.node}: "
                           "run 'higgsfield deploy' first")
        if self.settings.python:
            return code.stdout.strip(), None
        env = await t.run(["cat", posixpath.join(workdir, env_record(self.cfg.name))], check=False)
        try:   # the environment's record: the shape of ``invoker env``'s result (an absent or damaged one: none)
            python = decode(EnvReply, loads(env.stdout)).python if env.ok else None
        except DecodeError:
            python = None
        if not python:
            raise RunError(f"project '{self.cfg.name}' has no project environment in {self.settings.workdir} on "
                           f"{t.node}: run 'higgsfield deploy' (it builds one from requirements.txt)")
        return code.stdout.strip(), python

    async def start(self, plan: SlurmPlan, secrets: Mapping[str, str] | None = None) -> RunHandle:
        code, python = await self._deployed()
        if self.cfg.data:   # the workdir's copy of a data: entry is every compute node's: a stale one is refused
            await self._refuse_stale_data()
        nproc = self.cfg.nproc_per_node
        spec = template_spec(project=self.cfg.name, experiment=plan.experiment, run=plan.run, module=plan.module,
                             code_dir=code, params=plan.params, nproc=None if nproc == "auto" else int(nproc),
                             max_restarts=plan.max_restarts, checkpoint_mirror=self.cfg.checkpoint.mirror or "",
                             min_nodes=plan.min_nodes, max_recoveries=plan.max_recoveries, **plan.stall.spec_fields())
        settings = plan.settings if python is None else plan.settings.model_copy(update={"python": python})
        submitted = await SlurmCluster(self.transport, settings).submit(spec, dict(secrets or {}),
                                                                        allow_drift=plan.allow_drift)
        return RunHandle(self.cfg.name, plan.experiment, plan.run, [], job_id=submitted.job_id)

    async def _refuse_stale_data(self) -> None:
        """DataError (exit 2, one line naming the login node and the entry) for a data: entry whose copy in the
        workdir is missing or not this project's version: the check ``run`` makes on SSH nodes, on the one copy."""
        from higgsfield.control.backends.nodes.data.check import refuse_stale
        from higgsfield.control.remote import Group, Member

        login = self.cfg.on_login_node()
        await refuse_stale(login, Group([Member(login.nodes[0], self.transport, 0)]))

    # -- status -----------------------------------------------------------------------------

    async def runs(self) -> RunList:
        return RunList(await self.cluster.statuses(self.cfg.name))

    async def find(self, target: str) -> RunStatus:
        return resolve_target((await self.runs()).runs, target)[0]

    async def final_status(self, run: str) -> RunStatus:
        deadline = time.monotonic() + FINAL_WAIT_S
        status = await self.cluster.status(self.cfg.name, run)
        while status.state in ACTIVE and time.monotonic() < deadline:
            await asyncio.sleep(FINAL_POLL_S)
            status = await self.cluster.status(self.cfg.name, run)
        return status

    # -- logs -------------------------------------------------------------------------------

    def follow(self, handle: RunHandle) -> AsyncIterator[LogLine]:
        return self._lines(handle.run, follow=True)

    def logs(self, status: RunStatus, *, follow: bool = False, node: str | None = None,
             ranks: tuple[int, ...] = (), since: float | None = None) -> AsyncIterator[LogLine]:
        return self._lines(status.run, follow=follow, node=node, ranks=ranks, since=since)

    async def _lines(self, run: str, *, follow: bool, node: str | None = None, ranks: tuple[int, ...] = (),
                     since: float | None = None) -> AsyncIterator[LogLine]:
        """The ranks' lines tagged with their node (from the allocation the job pinned), as for SSH runs."""
        project = self.cfg.name
        if not await self._started(run, follow):
            return
        placed = await self.cluster.placement(project, run)
        hosts = list(placed.spec.nodes) if placed else []   # each rank's host: the contract's rule, as slurm_task's
        nproc = max(1, (placed.spec.nproc if placed else None) or 1)
        argv = self.cluster.logs_argv(project, run, follow=follow, since=since)
        for r in ranks:
            argv += ["--rank", str(r)]
        stream = self._read(run, argv, follow)
        async with contextlib.aclosing(stream) as lines:  # type: ignore[type-var]
            async for line in lines:
                rank_text, _, text = line.partition("\t")
                if not rank_text.lstrip("-").isdigit():
                    continue  # a heartbeat
                rank = int(rank_text)
                who = node_of_rank(hosts, nproc, rank) or LAUNCHER_NODE
                if node is None or who == node:
                    yield LogLine(who, rank, text)

    # -- metrics ----------------------------------------------------------------------------

    def metrics(self, status: RunStatus, *, follow: bool = False) -> AsyncIterator[MetricsItem]:
        return self._metrics(status.run, follow)

    async def _metrics(self, run: str, follow: bool) -> AsyncIterator[MetricsItem]:
        """Rank 0's ``metrics.jsonl`` in the run's directory of the shared workdir, read by the login node."""
        if not await self._started(run, follow):
            return
        lines = self._read(run, self.cluster.metrics_argv(self.cfg.name, run, follow=follow), follow)
        async with contextlib.aclosing(lines):  # type: ignore[type-var]
            async for m in parse_metrics(lines):
                yield m

    async def _started(self, run: str, follow: bool) -> bool:
        """Whether the job has started (it wrote its record); following, wait as long as Slurm keeps it queued."""
        while await self.cluster.record(self.cfg.name, run) is None:   # queued: nothing written yet
            if not follow or not (await self.cluster.status(self.cfg.name, run)).active:
                return False
            await asyncio.sleep(QUEUED_POLL_S)
        return True

    def _read(self, run: str, argv: list[str], follow: bool) -> AsyncIterator[str]:
        """``argv``'s lines on the login node; following, they end too once Slurm has ended the job."""
        stream = self.transport.stream(argv)
        if follow:
            return _until_slurm_ends(stream, lambda: self.cluster.status(self.cfg.name, run))
        return stream

    # -- the partition ----------------------------------------------------------------------

    async def machines(self) -> list[ClusterNode]:
        """The partition's compute nodes as Slurm sees them (the dashboard's node view)."""
        return await self.cluster.machines()

    # -- stacks -----------------------------------------------------------------------------

    async def stacks(self, status: RunStatus, *, node: str | None = None, rank: int | None = None) -> StacksResult:
        """Every rank's stack: taken now on every node of the job's allocation (``srun --overlap``) while the job
        runs, else those its stall watchdog saved; RunError (exit 2) when there are none."""
        project, run = self.cfg.name, status.run
        if status.state == QUEUED:
            raise RunError(f"run '{run}' is queued: its ranks have not started, there are no stacks yet")
        found: list[RankStacks] | None
        missing: dict[str, str] = {}
        saved = not status.active
        if status.active:
            found, missing = await self.cluster.live_stacks(project, run)
        else:
            found = await self.cluster.saved_stacks(project, run)
            if found is None:
                raise RunError(f"run '{run}' is {status.state} and did not stall: no stacks were saved "
                               "(stacks of a run are taken while it runs)")
        picked = [s for s in found if (node is None or s.node == node) and (rank is None or s.rank == rank)]
        if node is not None:
            missing = {n: why for n, why in missing.items() if n == node}
        return StacksResult(picked, saved=saved, unreachable=missing)

    async def profile(self, status: RunStatus, *, steps: int = 3, dest: Any = None, node: str | None = None,
                      rank: int | None = None, memory: bool = False, timeout: float | None = None) -> Any:
        """``higgsfield profile`` through the login node (:mod:`higgsfield.control.backends.slurm.profile`)."""
        from higgsfield.control.backends.slurm.profile import WAIT_S, profile_job

        return await profile_job(self.cluster, self.cfg.name, status, steps=steps, node=node, rank=rank,
                                 memory=memory, dest=dest, timeout=WAIT_S if timeout is None else timeout)

    # -- kill -------------------------------------------------------------------------------

    async def kill(self, target: str) -> list[RunStatus]:
        runs = (await self.runs()).runs
        exact = [r for r in runs if r.run == target]
        chosen = exact or [r for r in runs if r.experiment == target and r.active]
        if not chosen:
            if any(r.experiment == target for r in runs):
                raise RunError(f"'{target}' has no queued or running run (see 'higgsfield status')")
            raise NoSuchRun(f"no run or experiment named '{target}' (see 'higgsfield status')")
        out = []
        for r in chosen:
            if r.active:
                await self.cluster.cancel(self.cfg.name, r.run)
            out.append(await self.cluster.status(self.cfg.name, r.run))
        return out


async def _until_slurm_ends(lines: AsyncIterator[str], ask: Any) -> AsyncIterator[str]:
    """``lines`` until they end, or until Slurm has ended the job for ENDED_GRACE_S (a node that died
    mid-write leaves a record that says running: the follower must not wait on it for ever)."""
    queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=10000)

    async def pump() -> None:
        try:
            async for line in lines:
                await queue.put(line)
        finally:
            await queue.put(None)

    task = asyncio.create_task(pump())
    ended_at: float | None = None
    try:
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), WATCH_S)
            except asyncio.TimeoutError:
                status = await ask()
                if status.active:
                    ended_at = None
                elif ended_at is None:
                    ended_at = time.monotonic()
                elif time.monotonic() - ended_at >= ENDED_GRACE_S:
                    return
                continue
            if item is None:
                break
            yield item
        await task  # the stream's own error, if it ended with one
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await lines.aclose()  # type: ignore[attr-defined]

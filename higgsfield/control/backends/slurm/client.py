"""Submit, query and cancel a run's Slurm job through the login node's Transport.

Use::

    cluster = SlurmCluster(transport_for(cfg, login_node), settings)
    job = await cluster.submit(spec, secrets={"WANDB_API_KEY": "..."}, max_restarts=1)
    st = await cluster.status(spec.project, spec.run)      # a RunStatus, like any backend's
    await cluster.cancel(spec.project, spec.run)           # scancel; the run reads as killed

The queue is Slurm's: a run is one batch job (:mod:`higgsfield.control.backends.slurm.script`), its files in
the shared workdir (:mod:`higgsfield.control.backends.slurm.layout`); ``job.json`` there keeps its job id.
Params travel in ``request.json`` and secrets in a 0600 ``secrets.json``, both written with
``put_bytes`` (SFTP): neither is ever in an argv, the script, or ``scontrol show job``.

A job's state comes from ``squeue`` while Slurm holds it (``-t all``: finished jobs stay
listed for ``MinJobAge``), then from ``sacct`` when the cluster keeps accounting (detected
once per cluster object), else from the run's own record (``run.json``, written by the job).
:mod:`higgsfield.control.backends.slurm.states` maps them to the run states.

This module is the client: the commands it runs on the login node and the files it writes
there. What Slurm prints is read by :mod:`~higgsfield.control.backends.slurm.parse`, a run's
status is merged by :mod:`~higgsfield.control.backends.slurm.runstatus`, and the script that lists
a project's runs on the login node is :mod:`~higgsfield.control.backends.slurm.listing`.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from higgsfield.contract.codec import encode
from higgsfield.contract.decode import MAX_FILE_BYTES, DecodeError, loads
from higgsfield.contract.errors import RunError
from higgsfield.contract.layout import KILL, SPEC, STACKS_FILE, runs_dir, slurm_cache_dir
from higgsfield.contract.runspec import DEFAULT_MAX_RECOVERIES, RunSpec
from higgsfield.contract.runstatus import RunStatus
from higgsfield.contract.slurm_stacks import SRUN_WAIT_S as STACKS_SRUN_WAIT_S
from higgsfield.contract.slurm_stacks import parse_saved, parse_srun
from higgsfield.contract.slurm_stacks import srun_argv as stacks_srun_argv
from higgsfield.contract.slurmjob import PinnedSlurmRun, SlurmJob, SlurmRequest, decode_job, decode_pinned
from higgsfield.contract.stacks import RankStacks
from higgsfield.contract.stall_policy import DEFAULT_STALL
from higgsfield.contract.states import ACTIVE
from higgsfield.control.backends.slurm.layout import RunPaths
from higgsfield.control.backends.slurm.listing import _LIST_RUNS, listed_runs
from higgsfield.control.backends.slurm.machines import ClusterNode, parse_sinfo_nodes, sinfo_nodes_argv
from higgsfield.control.backends.slurm.parse import Job, parse_sacct, parse_squeue, sbatch_error
from higgsfield.control.backends.slurm.runstatus import merge
from higgsfield.control.backends.slurm.script import BatchJob, render
from higgsfield.control.backends.slurm.states import map_state
from higgsfield.control.config.slurm import SlurmConfig
from higgsfield.control.remote.base import Transport

PENDING_NODE = "pending"   # the spec's node fields until the job knows its allocation
SQUEUE_FORMAT = "%i|%T|%N|%V|%S|%e|%r"   # the reason last: it is free text
SACCT_FIELDS = "JobIDRaw,State,ExitCode,NodeList,Submit,Start,End,Reason"
CANCEL_WAIT_S = 30.0


class SlurmError(RunError):
    """Slurm refused or failed an operation; the message is one line that says what to do."""


class SlurmRefused(SlurmError):
    """sbatch refused the job as asked (a bad partition, account, time limit): the user's to fix."""

    exit_code = 2


@dataclass(frozen=True)
class Submitted:
    job_id: str
    paths: RunPaths
    submitted_at: float


def template_spec(*, project: str, experiment: str, run: str, module: str, code_dir: str,
                  params: Mapping[str, Any], nproc: int | None = None, max_restarts: int = 0,
                  src_dir: str = "src", submitted_at: float | None = None, checkpoint_mirror: str = "",
                  stall_timeout: float = DEFAULT_STALL.stall_timeout,
                  startup_timeout: float = DEFAULT_STALL.startup_timeout,
                  on_stall: str = DEFAULT_STALL.on_stall, min_nodes: int = 0,
                  max_recoveries: int = DEFAULT_MAX_RECOVERIES) -> RunSpec:
    """A RunSpec for a Slurm run: the node fields say ``pending`` until the job pins them to its allocation.
    ``checkpoint_mirror`` (higgsfield.yml's URL, never its credentials: those are secrets) reaches the ranks;
    the stall watchdog's settings reach the job's batch step (:mod:`higgsfield.node.slurm_stall`), and so do
    ``max_recoveries`` and ``min_nodes`` (a lost node: :mod:`higgsfield.node.slurm_recovery`)."""
    return RunSpec(project=project, experiment=experiment, run=run, module=module, code_dir=code_dir,
                   params=dict(params), node=PENDING_NODE, node_rank=0, nodes=(PENDING_NODE,),
                   master_addr=PENDING_NODE, submitted_at=time.time() if submitted_at is None else submitted_at,
                   nproc=nproc, max_restarts=max_restarts, runtime="process", src_dir=src_dir,
                   checkpoint_mirror=checkpoint_mirror, stall_timeout=stall_timeout,
                   startup_timeout=startup_timeout, on_stall=on_stall, min_nodes=min_nodes,
                   max_recoveries=max_recoveries)


class SlurmCluster:
    """One Slurm cluster, reached through its login node's ``transport``."""

    def __init__(self, transport: Transport, settings: SlurmConfig) -> None:
        self.transport = transport
        self.settings = settings
        self._accounting: bool | None = None

    def paths(self, project: str, run: str) -> RunPaths:
        return RunPaths(self.settings.workdir, project, run)

    def batch_job(self, paths: RunPaths, max_restarts: int = 0, *, recover: bool = False) -> BatchJob:
        s = self.settings
        return BatchJob(paths=paths, python=s.interpreter, nodes=s.nodes, gpus_per_node=s.gpus_per_node,
                        cpus_per_task=s.cpus_per_task, partition=s.partition, account=s.account, time=s.time,
                        max_restarts=max_restarts, recover=recover, exclusive=s.exclusive, extra=tuple(s.extra))

    # -- submit -------------------------------------------------------------------------------

    async def submit(self, spec: RunSpec, secrets: Mapping[str, str] | None = None, *,
                     allow_drift: bool = False) -> Submitted:
        """Write the run's files into the workdir and ``sbatch`` its script; the job id is in ``job.json``.

        ``spec.max_restarts`` becomes the job's requeue count; ``allow_drift`` lets the job run on
        nodes that differ (its drift check, :mod:`higgsfield.node.slurm_drift`, then only reports). Raises :class:`SlurmRefused`
        with sbatch's reason in one line for a job Slurm will not take (the secrets file is
        removed again, with the run's directory), :class:`SlurmError` for a run name already used in the workdir.
        """
        paths = self.paths(spec.project, spec.run)
        t = self.transport
        exists = await t.run(["test", "-e", paths.job], check=False)
        if exists.ok:
            raise SlurmError(f"run '{spec.run}' already exists in {paths.dir} on {t.node}: choose another run name")
        await t.run(["mkdir", "-p", paths.logs, paths.checkpoints])
        await t.run(["chmod", "700", paths.dir, paths.logs])
        job = self.batch_job(paths, spec.max_restarts, recover=spec.max_recoveries > 0)
        script = render(job)  # ValueError for a value sbatch would misread: before anything is sent
        submitted_at = time.time()
        request = SlurmRequest(spec=spec, secret_names=sorted(secrets or {}), max_restarts=spec.max_restarts,
                               gpus_per_node=self.settings.gpus_per_node, checkpoint_dir=paths.checkpoints,
                               cache_dir=posixpath.join(self.settings.workdir, slurm_cache_dir(spec.project)),
                               submitted_at=submitted_at, allow_drift=allow_drift)
        await t.put_bytes(_json(encode(request)), paths.request, mode=0o600)
        if secrets:
            await t.put_bytes(_json(dict(secrets)), paths.secrets, mode=0o600)
        await t.put_bytes(script.encode(), paths.script, mode=0o700)
        result = await t.run(["sbatch", "--parsable", paths.script], check=False)
        if not result.ok:
            # nothing half-written: the run's directory (no job.json yet) and its empty checkpoint directory go
            await t.run(["rm", "-rf", paths.dir], check=False)
            await t.run(["rmdir", paths.checkpoints], check=False)
            raise SlurmRefused(f"Slurm refused run '{spec.run}': {sbatch_error(result.stderr or result.stdout)}"
                               f"{self._hint(result.stderr)}")
        job_id = result.stdout.strip().split(";", 1)[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch on {t.node} printed {result.stdout.strip()[:100]!r}, not a job id")
        record = SlurmJob(job_id=job_id, submitted_at=submitted_at, login=t.node, sbatch=job.sbatch_options(),
                          project=spec.project, experiment=spec.experiment, run=spec.run, params=dict(spec.params))
        await t.put_bytes(_json(encode(record)), paths.job, mode=0o600)
        return Submitted(job_id, paths, submitted_at)

    def _hint(self, stderr: str) -> str:
        low = stderr.lower()
        if "account" in low:  # "Invalid account or account/partition combination specified"
            acct = f"account '{self.settings.account}'" if self.settings.account else "your default account"
            part = f" with partition '{self.settings.partition}'" if self.settings.partition else ""
            return f" ({acct}{part} in the slurm block; 'sacctmgr show assoc user=$USER' lists yours)"
        if "partition" in low and self.settings.partition:
            return f" (partition '{self.settings.partition}' in the slurm block; 'sinfo -s' lists the partitions)"
        if "time limit" in low and self.settings.time:
            return f" (time '{self.settings.time}' in the slurm block is over the partition's limit)"
        return ""

    # -- query --------------------------------------------------------------------------------

    async def accounting(self) -> bool:
        """Whether the cluster keeps accounting (``sacct`` answers); asked once."""
        if self._accounting is None:
            r = await self.transport.run(["scontrol", "show", "config"], check=False)
            storage = next((ln.split("=", 1)[1].strip() for ln in r.stdout.splitlines()
                            if ln.split("=", 1)[0].strip() == "AccountingStorageType"), "")
            self._accounting = r.ok and storage not in ("", "accounting_storage/none")
        return self._accounting

    async def jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        """What Slurm knows of ``job_ids``: squeue first (live, with the pending reason), then sacct."""
        ids = [j for j in job_ids if j.isdigit()]
        if not ids:
            return {}
        found = await self.squeue(ids)
        missing = [j for j in ids if j not in found]
        if missing and await self.accounting():
            found.update(await self.sacct(missing))
        return found

    async def squeue(self, job_ids: Sequence[str]) -> dict[str, Job]:
        """The jobs slurmctld still holds (``-t all``: finished ones too, for ``MinJobAge``)."""
        r = await self.transport.run(["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", SQUEUE_FORMAT],
                                     check=False)   # a job id slurmctld forgot: exit 1, "Invalid job id"
        return parse_squeue(r.stdout) if r.ok else {}

    async def sacct(self, job_ids: Sequence[str]) -> dict[str, Job]:
        """The jobs in the accounting database (finished long ago too)."""
        r = await self.transport.run(["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids), "-o", SACCT_FIELDS],
                                     check=False)
        return {k: v for k, v in parse_sacct(r.stdout).items() if k in job_ids} if r.ok else {}

    async def submission(self, project: str, run: str) -> SlurmJob:
        """The run's ``job.json``, decoded: its Slurm job id, when and with what it was submitted."""
        paths = self.paths(project, run)
        r = await self.transport.run(["cat", paths.job], check=False)
        if not r.ok:
            raise SlurmError(f"no Slurm run '{run}' of project '{project}' in {self.settings.workdir} "
                             f"on {self.transport.node}")
        try:
            if len(r.stdout) > MAX_FILE_BYTES:
                raise DecodeError(f"too big (over {MAX_FILE_BYTES} bytes)")
            return decode_job(loads(r.stdout))
        except DecodeError as e:
            raise SlurmError(f"{paths.job} on {self.transport.node}: {e}") from None

    async def job_id(self, project: str, run: str) -> str:
        return (await self.submission(project, run)).job_id

    async def record(self, project: str, run: str) -> dict[str, Any] | None:
        """The job's own record of the run (``run.json``), once the job has started."""
        r = await self.transport.run(["cat", self.paths(project, run).record], check=False)
        if not r.ok:
            return None
        try:
            data = json.loads(r.stdout)
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    async def status(self, project: str, run: str) -> RunStatus:
        """The run as ``status --json`` shows it: Slurm's state mapped, the job's record for the details."""
        submitted = await self.submission(project, run)
        jobs, record = await asyncio.gather(self.jobs([submitted.job_id]), self.record(project, run))
        return merge(submitted, jobs.get(submitted.job_id), record)

    async def statuses(self, project: str) -> list[RunStatus]:
        """Every run of ``project`` in the workdir (oldest first): one read of the records, one squeue, one sacct."""
        return (await self.listing(project))[0]

    async def listing(self, project: str) -> tuple[list[RunStatus], list[str]]:
        """:meth:`statuses`, and one line for each run directory whose ``job.json`` does not decode (skipped)."""
        root = posixpath.join(self.settings.workdir, runs_dir(project))
        r = await self.transport.run(["python3", "-c", _LIST_RUNS, root], check=False)
        if not r.ok:
            raise SlurmError(f"cannot list the runs in {self.settings.workdir} on {self.transport.node}: "
                             f"{sbatch_error(r.stderr)}")
        try:
            items, skipped = listed_runs(r.stdout, project)
        except DecodeError:
            raise SlurmError(f"{self.transport.node} listed the runs as {r.stdout[:100]!r}, not JSON") from None
        jobs = await self.jobs([i.job.job_id for i in items])
        out = [merge(i.job, jobs.get(i.job.job_id), i.record) for i in items]
        return sorted(out, key=lambda st: st.created_at), skipped

    async def placement(self, project: str, run: str) -> PinnedSlurmRun | None:
        """The spec the job pinned to its allocation (``spec.json``: its nodes in node-rank order, nproc);
        None while there is none, or one that does not decode (the job has not placed its ranks)."""
        r = await self.transport.run(["cat", self.paths(project, run).file(SPEC)], check=False)
        try:
            return decode_pinned(loads(r.stdout)) if r.ok else None
        except DecodeError:
            return None

    # -- stacks -------------------------------------------------------------------------------

    async def live_stacks(self, project: str, run: str) -> tuple[list[RankStacks], dict[str, str]]:
        """Every rank's stack now: one ``stacks`` task per node of the job's allocation, through ``srun
        --overlap`` on the login node (:mod:`~higgsfield.contract.slurm_stacks`); ``node -> why`` for
        the nodes that gave none. SlurmError when the job has not placed its ranks yet."""
        placed = await self.placement(project, run)
        nodes = list(placed.spec.nodes) if placed else []
        python = (placed.python if placed else "") or self.settings.interpreter
        if not nodes:
            raise SlurmError(f"run '{run}' has not started on its nodes yet: no stacks to take")
        job_id = await self.job_id(project, run)
        argv = stacks_srun_argv(job_id, len(nodes), python, self.paths(project, run).dir)
        r = await self.transport.run(argv, check=False, timeout=STACKS_SRUN_WAIT_S + 10)
        found, missing = parse_srun(r.stdout, nodes)
        if not found and not r.ok:
            why = sbatch_error(r.stderr or r.stdout) or f"exit {r.exit_status}"
            raise SlurmError(f"srun --overlap --jobid={job_id} on {self.transport.node}: {why}")
        return found, missing

    async def saved_stacks(self, project: str, run: str) -> list[RankStacks] | None:
        """The stacks the job saved at its stall (``stacks.json`` in the run's directory), or None."""
        r = await self.transport.run(["cat", self.paths(project, run).file(STACKS_FILE)], check=False)
        if not r.ok:
            return None
        if len(r.stdout) > MAX_FILE_BYTES:
            raise SlurmError(f"{self.paths(project, run).file(STACKS_FILE)} on {self.transport.node} is too big")
        try:
            return parse_saved(r.stdout)
        except DecodeError as e:
            raise SlurmError(f"{self.paths(project, run).file(STACKS_FILE)} on {self.transport.node}: {e}") from None

    # -- cancel -------------------------------------------------------------------------------

    async def cancel(self, project: str, run: str, *, wait: float = CANCEL_WAIT_S) -> Job | None:
        """``scancel`` the run's job (the job records the run as killed); wait until Slurm no longer runs it."""
        paths = self.paths(project, run)
        job_id = await self.job_id(project, run)
        t = self.transport
        await t.run(["touch", paths.file(KILL)])
        await t.run(["rm", "-f", paths.secrets])  # a pending job never takes them
        r = await t.run(["scancel", job_id], check=False)
        if not r.ok:
            raise SlurmError(f"scancel {job_id} on {t.node}: {sbatch_error(r.stderr)}")
        deadline = time.monotonic() + wait
        while True:
            job = (await self.jobs([job_id])).get(job_id)
            if job is None or map_state(job.state).state not in ACTIVE:  # COMPLETING is still active
                return job
            if time.monotonic() > deadline:
                raise SlurmError(f"job {job_id} is still {job.state} {wait:.0f} s after scancel")
            await asyncio.sleep(0.2)

    # -- logs ---------------------------------------------------------------------------------

    def invoker_argv(self, *args: str) -> list[str]:
        """``higgsfield invoker ARGS`` of the workdir's environment on the login node, the workdir its state dir:
        it reads a Slurm run's directory exactly as it reads an SSH node's."""
        return [self.settings.interpreter, "-m", "higgsfield", "invoker", "--state-dir", self.settings.workdir,
                *args]

    def logs_argv(self, project: str, run: str, *, follow: bool = False, since: float | None = None) -> list[str]:
        """``higgsfield invoker logs`` of the run: ``RANK<TAB>LINE`` lines."""
        argv = self.invoker_argv("logs", "--project", project, "--run", run)
        if follow:
            argv.append("--follow")
        if since is not None:
            argv += ["--since", repr(since)]
        return argv

    def metrics_argv(self, project: str, run: str, *, follow: bool = False) -> list[str]:
        """``higgsfield invoker metrics`` of the run: rank 0's StepMetrics, one JSON line each."""
        argv = self.invoker_argv("metrics", "--project", project, "--run", run)
        return [*argv, "--follow"] if follow else argv

    async def machines(self) -> list[ClusterNode]:
        """The partition's compute nodes as Slurm sees them (``sinfo -N``): state, load, memory, GPUs."""
        r = await self.transport.run(sinfo_nodes_argv(self.settings.partition), check=False)
        if not r.ok:
            raise SlurmError(f"sinfo on {self.transport.node}: {sbatch_error(r.stderr)}")
        return parse_sinfo_nodes(r.stdout)

    async def logs(self, project: str, run: str, *, follow: bool = False,
                   poll: float = 0.5) -> AsyncIterator[tuple[int, str]]:
        """``(rank, line)`` of every rank's log (rank -1: the launcher), waiting while the job is queued."""
        while await self.record(project, run) is None:
            st = await self.status(project, run)
            if not follow or not st.active:
                return
            await asyncio.sleep(poll)
        async for line in self.transport.stream(self.logs_argv(project, run, follow=follow)):
            rank, _, text = line.partition("\t")
            if rank.lstrip("-").isdigit():
                yield int(rank), text


def _json(data: object) -> bytes:
    return (json.dumps(data, sort_keys=True) + "\n").encode()


__all__ = ["SlurmCluster", "SlurmError", "SlurmRefused", "Submitted", "template_spec"]

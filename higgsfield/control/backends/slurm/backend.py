"""A Slurm cluster as a :class:`~higgsfield.control.backends.backend.Backend`: one batch job per run, Slurm the queue.

Everything goes through the login node, reached over SSH like any node (its host key
pinned by ``setup``, verified here): ``higgsfield.yml``'s ``slurm:`` block seen as a
project of one node whose state directory is the shared workdir
(:meth:`~higgsfield.control.config.Config.on_login_node`). So ``deploy`` is the SSH deploy
itself, aimed at the login node: a commit-addressed release under
``<workdir>/projects/<project>/releases/`` with its ``code`` link swapped, and the
project environment (the venv keyed by requirements.txt) under ``<workdir>/envs/``,
which every compute node sees.

A run is submitted by :class:`higgsfield.control.backends.slurm.SlurmCluster` with the release it
starts from pinned (the link resolved at submit) and the project environment's
python; its status is Slurm's (squeue, then sacct where accounting exists, the run's
own record otherwise); its logs are the ranks' files in the workdir, read by the
invoker on the login node and tagged ``node/rank`` from the allocation the job
pinned (``spec.json``), exactly as an SSH run's, and so are rank 0's step metrics; ``kill`` is scancel;
``--max-restarts`` is the job's requeue count after a crash; a lost node is recovered from by a requeue
without it (``--max-recoveries``, ``--min-nodes``: :mod:`higgsfield.node.slurm_recovery`). The allocation's nodes are compared for drift inside the job,
before torchrun (:mod:`higgsfield.node.slurm_drift`); ``--allow-drift`` reaches it in ``request.json``. The stall watchdog runs inside the job (its batch step,
:mod:`higgsfield.node.slurm_stall`), laptop or not; ``stacks`` runs the node side's stack taker on every
node of the allocation with ``srun --overlap --jobid`` (or reads the stacks saved at a stall).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from higgsfield.contract.errors import ConfigError, RunError
from higgsfield.contract.params import check_run_name, resolve
from higgsfield.control.backends.backend import Changed, Fleet, Plan, RunRequest, recovery_settings
from higgsfield.control.backends.nodes.deploy import DeployResult, deploy
from higgsfield.control.backends.nodes.start import RunHandle, new_run_name
from higgsfield.control.backends.slurm.fleet import ClusterFleet
from higgsfield.control.backends.slurm.script import exclude_option
from higgsfield.control.backends.slurm.session import SlurmPlan, SlurmSession
from higgsfield.control.config import Config
from higgsfield.control.config.slurm import SlurmConfig
from higgsfield.control.project.discovery import find_experiment
from higgsfield.control.remote import open_group

__all__ = ["SlurmBackend", "SlurmPlan", "SlurmSession"]


class SlurmBackend:
    name = "slurm"

    def __init__(self, cfg: Config) -> None:
        if cfg.slurm is None:
            raise RunError("SlurmBackend needs a config with a slurm block")
        self.cfg = cfg
        self.login_cfg = cfg.on_login_node()
        self.settings: SlurmConfig = cfg.slurm   # checked as the config was loaded; plan() copies it per run

    def plan(self, request: RunRequest) -> SlurmPlan:
        exp = find_experiment(self.cfg.project_dir / "src", request.experiment)
        values = resolve(exp.params, dict(request.params), request.experiment)
        if request.run_name is not None:
            check_run_name(request.run_name)
        if request.spares:
            raise ConfigError("--spares is for SSH nodes: on Slurm the partition's free nodes stand in for a lost "
                              "one (the job is requeued without it; --max-recoveries, --min-nodes)")
        settings = self.settings.override(nodes=request.nodes, time=request.time, partition=request.partition)
        if request.min_nodes is not None and not 1 <= request.min_nodes <= settings.nodes:
            raise ConfigError(f"--min-nodes {request.min_nodes}: the run asks for {settings.nodes} node(s); give 1 to "
                              f"{settings.nodes} (the fewest it may go on on after losing some)")
        floor, recoveries = recovery_settings(self.cfg, settings.nodes, request.min_nodes, request.max_recoveries)
        if request.exclusive:
            settings = settings.model_copy(update={"exclusive": True})
        if request.exclude:
            settings = settings.model_copy(update={"extra": [*settings.extra, exclude_option(request.exclude)]})
        return SlurmPlan(experiment=request.experiment, module=exp.module, params=values,
                         run=request.run_name or new_run_name(request.experiment),
                         max_restarts=request.max_restarts, settings=settings, stall=request.stall(self.cfg),
                         allow_drift=request.allow_drift,
                         min_nodes=floor, max_recoveries=recoveries)

    @asynccontextmanager
    async def session(self, plan: Plan | None = None) -> AsyncIterator[SlurmSession]:
        settings = plan.settings if isinstance(plan, SlurmPlan) else self.settings
        async with open_group(self.login_cfg) as group:
            yield SlurmSession(self.cfg, settings, group.members[0].transport)

    def deploy(self, *, dirty: bool = False, console: Any = None) -> DeployResult:
        """The SSH deploy aimed at the login node: the release and the project environment land in the workdir."""
        return deploy(self.login_cfg, dirty=dirty, console=console)

    def describe(self, handle: RunHandle) -> str:
        return f"as Slurm job {handle.job_id} (through {self.login_cfg.nodes[0].host})"

    def fleet(self, changed: Changed, *, sample_every: float | None = None, silent: float | None = None) -> Fleet:
        """The dashboard's view of the cluster, Slurm asked through the login node (``silent`` is for SSH nodes)."""
        return ClusterFleet(self.cfg, self.login_cfg.nodes[0], self.settings.partition, self.session, changed,
                            every=sample_every)

"""Where a Slurm run's files live in the shared workdir, as the control side names them.

The run directory is the one an SSH node keeps under its state dir
(``<state>/runs/<project>/<run>/``, :class:`higgsfield.node.state.records.RunDir`), with the
workdir as the state dir, so ``higgsfield invoker --state-dir WORKDIR logs ...`` on the login
node reads a Slurm run exactly as it reads an SSH node's::

    <workdir>/runs/<project>/<run>/
        request.json   the control side's RunSpec (the allocation not known yet) and the job's settings
        secrets.json   0600, written at submit, taken by the job as it starts (kept while it may be requeued)
        job.sh         the batch script (no params, no secrets)
        job.json       the control side's record of the submission: the Slurm job id, when, with what
        spec.json, run.json, logs/rank<N>.log, logs/launcher.log ...   written by the job (node side)
    <workdir>/checkpoints/<project>/<run>/   HIGGSFIELD_CHECKPOINT_DIR: every node and every requeue sees it

The names themselves are :mod:`higgsfield.contract.layout`'s, which the node side
(:mod:`higgsfield.node.slurm_task`) spells from too.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from higgsfield.contract.layout import (
    JOB,
    LAUNCHER_LOG,
    LOGS,
    RECORD,
    REQUEST,
    SCRIPT,
    SECRETS,
    run_dir,
    slurm_checkpoint_dir,
)

__all__ = ["JOB", "LAUNCHER_LOG", "LOGS", "RECORD", "REQUEST", "SCRIPT", "SECRETS", "RunPaths"]


@dataclass(frozen=True)
class RunPaths:
    """The absolute paths of one run in the workdir (strings: they are paths on the cluster, not here)."""

    workdir: str
    project: str
    run: str

    @property
    def dir(self) -> str:
        return posixpath.join(self.workdir, run_dir(self.project, self.run))

    def file(self, name: str) -> str:
        return posixpath.join(self.dir, name)

    @property
    def request(self) -> str:
        return self.file(REQUEST)

    @property
    def secrets(self) -> str:
        return self.file(SECRETS)

    @property
    def script(self) -> str:
        return self.file(SCRIPT)

    @property
    def job(self) -> str:
        return self.file(JOB)

    @property
    def record(self) -> str:
        return self.file(RECORD)

    @property
    def logs(self) -> str:
        return self.file(LOGS)

    @property
    def launcher_log(self) -> str:
        return posixpath.join(self.logs, LAUNCHER_LOG)

    @property
    def checkpoints(self) -> str:
        return posixpath.join(self.workdir, slurm_checkpoint_dir(self.project, self.run))

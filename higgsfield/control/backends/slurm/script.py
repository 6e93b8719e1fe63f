"""The batch script of a run: ``#SBATCH`` lines for the allocation, then one ``srun`` task per node.

::

    #!/bin/bash
    #SBATCH --job-name=RUN
    #SBATCH --nodes=N
    #SBATCH --ntasks-per-node=1
    #SBATCH --gpus-per-node=G            (left out for G = 0)
    #SBATCH --partition=P --account=A --time=T   (each when set, one per line)
    #SBATCH --exclusive                  (whole nodes, unless the settings say exclusive: false)
    #SBATCH --exclude=n1,n2              (run --exclude; with slurm.extra's options, at the end)
    #SBATCH --output=RUN_DIR/logs/launcher.log
    #SBATCH --requeue + --open-mode=append    (max_restarts > 0 or a run that recovers; else --no-requeue)
    set -eu
    master=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
    exec PYTHON -m higgsfield.node.slurm_task batch RUN_DIR --master "$master" -- \\
        srun --ntasks-per-node=1 --kill-on-bad-exit=1 \\
        PYTHON -m higgsfield.node.slurm_task node RUN_DIR --master "$master"

The batch step (on the allocation's first node) takes the secrets file, picks the
rendezvous port, runs the ``srun`` line, and writes the run's record; each node's task
starts torchrun with the c10d rendezvous on ``$master`` (see :mod:`higgsfield.node.slurm_task`).

The script is a file on the cluster, but nothing a user names may break it: ``#SBATCH``
values are checked to be one plain word (sbatch reads those lines with its own parser,
not a shell), and every value in the shell part is :func:`shlex.quote`'d. Params and
secrets are never in it (``scontrol write batch_script`` shows it to anyone who may see the job).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from higgsfield.contract.slurm_stacks import TASK_MODULE
from higgsfield.control.backends.slurm.layout import RunPaths

#: What a #SBATCH value may be: sbatch splits those lines on blanks and reads quotes and '%' itself.
SBATCH_VALUE_RE = re.compile(r"\A[A-Za-z0-9_./+@:,=-]+\Z")


_NODE_NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


def exclude_option(nodes: tuple[str, ...] | list[str]) -> str:
    """``run --exclude n1,n2`` as the sbatch word ``--exclude=n1,n2``; a name that is not one plain node
    name is a ConfigError (exit 2) before anything is sent (sbatch itself refuses a node it does not know)."""
    from higgsfield.contract.errors import ConfigError

    bad = [n for n in nodes if not _NODE_NAME_RE.fullmatch(n)]
    if bad or not nodes:
        raise ConfigError(f"--exclude {','.join(bad)}: not a Slurm node name (letters, digits, _ . - only)")
    return f"--exclude={','.join(nodes)}"


@dataclass(frozen=True)
class BatchJob:
    """Everything the batch script says: the allocation and where the run's files are."""

    paths: RunPaths
    python: str                     # the project environment's interpreter on the compute nodes
    nodes: int
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    max_restarts: int = 0
    recover: bool = False
    """The run recovers from a lost node (``max_recoveries`` > 0): requeued, by itself or by Slurm, without it."""
    exclusive: bool = True
    extra: tuple[str, ...] = ()

    @property
    def job_name(self) -> str:
        return self.paths.run

    def sbatch_options(self) -> list[str]:
        """The ``--option=value`` words of the ``#SBATCH`` lines, in order."""
        opts = [f"--job-name={self.job_name}", f"--nodes={self.nodes}", "--ntasks-per-node=1"]
        if self.gpus_per_node:
            opts.append(f"--gpus-per-node={self.gpus_per_node}")
        if self.cpus_per_task:
            opts.append(f"--cpus-per-task={self.cpus_per_task}")
        for name, value in (("partition", self.partition), ("account", self.account), ("time", self.time)):
            if value is not None:
                opts.append(f"--{name}={value}")
        if self.exclusive:
            opts.append("--exclusive")
        opts.append(f"--output={self.paths.launcher_log}")
        if self.max_restarts > 0 or self.recover:
            opts += ["--requeue", "--open-mode=append"]
        else:
            opts.append("--no-requeue")
        opts += list(self.extra)
        for opt in opts:
            if not SBATCH_VALUE_RE.fullmatch(opt):
                raise ValueError(f"#SBATCH {opt!r}: a value with a blank, a quote or '%' would be misread by "
                                 "sbatch; use letters, digits and _ . / + @ : , = - only")
        return opts

    def task_argv(self, role: str) -> list[str]:
        """``PYTHON -m higgsfield.node.slurm_task ROLE RUN_DIR`` (``--master "$master"`` is added in the script)."""
        return [self.python, "-m", TASK_MODULE, role, self.paths.dir]

    def srun_argv(self) -> list[str]:
        return ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]


def render(job: BatchJob) -> str:
    """The batch script's text."""
    q = shlex.join
    sbatch = "".join(f"#SBATCH {opt}\n" for opt in job.sbatch_options())
    master = '--master "$master"'
    return (
        "#!/bin/bash\n"
        f"{sbatch}"
        f"# higgsfield: run {job.paths.run} of project {job.paths.project}; its spec is request.json next to\n"
        "# this script, its secrets come in a 0600 file that the job deletes as it starts.\n"
        "set -eu\n"
        'master=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
        f"exec {q(job.task_argv('batch'))} {master} -- \\\n"
        f"    {q(job.srun_argv())} \\\n"
        f"    {q(job.task_argv('node'))} {master}\n"
    )

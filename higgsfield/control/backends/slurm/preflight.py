"""What ``setup`` and ``doctor`` ask a Slurm cluster's login node, and what the answers mean.

Read-only commands (``setup``'s check and ``doctor`` ask them through one probe each):

- :data:`WHICH`: sbatch, srun, squeue, scancel and sinfo are on the login user's PATH;
- :data:`SINFO`: the partitions, their nodes by state, and the GPUs (``gres``) they have;
- :func:`test_only_argv`: ``sbatch --test-only`` of a job shaped like a run (nodes,
  partition, account, time, GPUs): slurmctld validates it as it would a real one
  (the partition exists, the account may use it, the time fits) and starts nothing.

Each answer becomes a :class:`Finding`: ok, a short summary, and for a problem one
line that names the ``slurm.`` field and what to do. The shared-workdir check needs a
compute node, so it is ``setup``'s apply (:func:`shared_argv`, ``srun --immediate``).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from higgsfield.control.backends.slurm.parse import sbatch_error
from higgsfield.control.config.slurm import SlurmConfig

COMMANDS = ("sbatch", "srun", "squeue", "scancel", "sinfo")
# one name per 'command -v': dash's takes only its first argument
WHICH = ("sh", "-c", 'for c in "$@"; do command -v "$c"; done', "sh", *COMMANDS)
SINFO = ("sinfo", "-h", "-o", "%P|%a|%t|%D|%G")   # partition (* = default)|avail|state|node count|gres
SHARED_MARK = ".higgsfield-shared"   # in the workdir once a compute node read what the login node wrote there
SHARED_WAIT_S = 30                    # srun --immediate: how long the shared check waits for a node
_GPU = re.compile(r"^gpu(?::[^:(]+)?:(\d+)")


@dataclass(frozen=True)
class Finding:
    ok: bool
    summary: str
    problem: str | None = None
    fix: str | None = None


@dataclass
class Partition:
    name: str
    default: bool = False
    up: bool = True
    nodes: int = 0
    idle: int = 0
    gpus: int = 0
    states: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        gpus = f", {self.gpus} GPUs" if self.gpus else ""
        return f"{self.name}{'*' if self.default else ''}: {self.nodes} nodes, {self.idle} idle{gpus}" + \
            ("" if self.up else " (down)")


def parse_sinfo(out: str) -> list[Partition]:
    """``sinfo -h -o '%P|%a|%t|%D|%G'`` as partitions (one line per partition and node state)."""
    parts: dict[str, Partition] = {}
    for line in out.splitlines():
        cols = line.strip().split("|")
        if len(cols) != 5 or not cols[0]:
            continue
        name, avail, state, count, gres = cols
        default = name.endswith("*")
        p = parts.setdefault(name.rstrip("*"), Partition(name.rstrip("*"), default=default, up=avail == "up"))
        n = int(count) if count.isdigit() else 0
        word = state.rstrip("*~#!%$@^-")
        p.nodes += n
        p.states[word] = p.states.get(word, 0) + n
        if word == "idle":
            p.idle += n
        p.gpus += n * sum(int(m.group(1)) for g in gres.split(",") if (m := _GPU.match(g.strip())))
    return list(parts.values())


def commands(which_stdout: str) -> Finding:
    found = {posixpath.basename(p.strip()) for p in which_stdout.splitlines() if p.strip()}
    missing = [c for c in COMMANDS if c not in found]
    if missing:
        return Finding(False, "missing " + ", ".join(missing),
                       f"{', '.join(missing)} not found on the login node's PATH: is this a Slurm login node?",
                       "point slurm.login at the cluster's login node (or load its Slurm module in ~/.bashrc)")
    return Finding(True, "sbatch srun squeue scancel sinfo")


def partition(settings: SlurmConfig, parts: Sequence[Partition]) -> Finding:
    """The configured partition(s) exist (a missing one is the user's to fix in higgsfield.yml)."""
    names = [p.name for p in parts]
    if not parts:
        return Finding(False, "no partitions", "sinfo lists no partition", "ask the cluster's admins")
    if settings.partition is None:
        default = next((p for p in parts if p.default), None)
        return Finding(default is not None, default.describe() if default else "no default",
                       None if default else "the cluster has no default partition",
                       None if default else f"set slurm.partition (partitions: {', '.join(names)})")
    wanted = settings.partition.split(",")
    unknown = [w for w in wanted if w not in names]
    if unknown:
        return Finding(False, f"no {unknown[0]}", f"partition '{unknown[0]}' does not exist on the cluster "
                       f"(partitions: {', '.join(names)})", "set slurm.partition in higgsfield.yml to one of them")
    return Finding(True, "; ".join(p.describe() for p in parts if p.name in wanted))


def test_only_argv(settings: SlurmConfig) -> tuple[str, ...]:
    """``sbatch --test-only`` of a job shaped like a run: validated by slurmctld, never started."""
    s = settings
    argv = ["sbatch", "--test-only", f"--nodes={s.nodes}", "--ntasks-per-node=1", "--job-name=higgsfield-check",
            "--output=/dev/null"]
    if s.gpus_per_node:
        argv.append(f"--gpus-per-node={s.gpus_per_node}")
    for name, value in (("partition", s.partition), ("account", s.account), ("time", s.time)):
        if value is not None:
            argv.append(f"--{name}={value}")
    return (*argv, *s.extra, "--wrap", "true")


def submit(settings: SlurmConfig, ok: bool, stdout: str, stderr: str) -> Finding:
    """What ``sbatch --test-only`` said of a run's shape (the account and partition, the time, the size)."""
    if ok:
        return Finding(True, f"account {settings.account or '(default)'}: a {settings.nodes}-node job is accepted")
    why = sbatch_error(stderr or stdout)
    low = why.lower()
    if "account" in low:
        acct = f"account '{settings.account}'" if settings.account else "your default account"
        return Finding(False, "refused", f"Slurm refuses {acct}"
                       + (f" on partition '{settings.partition}'" if settings.partition else "") + f": {why}",
                       "set slurm.account in higgsfield.yml to one of yours (sacctmgr show assoc user=$USER)")
    if "partition" in low:
        return Finding(False, "refused", f"Slurm refuses partition '{settings.partition}': {why}",
                       "set slurm.partition in higgsfield.yml to one of the partitions 'sinfo -s' lists")
    if "time limit" in low:
        return Finding(False, "refused", f"Slurm refuses time '{settings.time}': {why}",
                       "lower slurm.time in higgsfield.yml (or pass --time per run)")
    return Finding(False, "refused", f"Slurm refuses a job of {settings.nodes} node(s): {why}",
                   "check slurm.nodes, gpus_per_node and extra in higgsfield.yml against 'sinfo -s'")


def shared_argv(settings: SlurmConfig, path: str) -> tuple[str, ...]:
    """One task on one compute node that prints ``path`` (written by the login node): the workdir is shared."""
    argv = ["srun", f"--immediate={SHARED_WAIT_S}", "--nodes=1", "--ntasks=1", "--job-name=higgsfield-setup",
            "--quiet"]
    for name, value in (("partition", settings.partition), ("account", settings.account)):
        if value is not None:
            argv.append(f"--{name}={value}")
    return (*argv, "--time=1", "cat", path)


def shared_mark(settings: SlurmConfig) -> str:
    return posixpath.join(settings.workdir, SHARED_MARK)

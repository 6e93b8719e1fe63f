"""Every path a node keeps, by name: the one layout the node side writes and the control side reads.

::

    <state dir>/                       DEFAULT_STATE_DIR unless higgsfield.yml's ``state_dir`` (a Slurm run: its workdir)
        venv/                          the invoker itself (``venv/bin/higgsfield``), installed by ``setup``
        wheels/, tmp/                  what ``setup`` uploads (the wheel and its wheelhouse) and downloads
        queue.json, queue.lock         the node's queue and the flock of its read-modify-write (node.gang.queue)
        trash/                         runs a prune renamed away and is removing (node.runs.prune)
        projects/<project>/            the project on this node (node.code.deploy, node.code.environment)
            releases/<commit12>-<time>-<hex>/   one unpacked tree per deploy
            code -> releases/...       the deployed tree (:func:`code_dir`: what a run's ``code_dir`` names)
            deployed.json              {commit, dirty, release, deployed_at}
            image.json, build.log      the image deploy built, and the build's output
            env.json, env-build.log    the project environment of ``runtime: process``, and pip's output
        envs/<project>/<key>/          that environment's venvs; envs/<project>/.lock while one is built
        runs/<project>/<run>/          one run (node.state.records.RunDir)
            run.json                   the record (the node's supervisor writes it; status reads it)
            spec.json                  the pinned RunSpec that every worker reads
            kill                       the kill marker the supervisor watches
            .lock                      flock'd while a start checks and records the run (and by a prune)
            logs/launcher.log          torchrun's own output; logs/rank<N>.log, .idx, .error.json, .done per rank
            progress/rank<N>           the rank's last reported step and its wall time (``higgsfield.training.progress``)
            stacks/rank<N>             where the rank's faulthandler dumps its threads when the node signals it
                                       (``higgsfield.node.runs.stacks``); stacks/rank<N>.json: its pid and main thread
            stacks.json                every rank's stacks on this node, taken at a stall
            metrics.jsonl              rank 0's step metrics (``higgsfield.metrics.METRICS_FILE``)
            facts/<attempt>/           a Slurm job's nodes' facts (<node>.json) and their verdict (drift.json),
                                       compared before torchrun (node.slurm_drift)
            request.json, secrets.json, job.sh, job.json   a Slurm run's submission
        checkpoints/<project>/<run>/   a Slurm run's checkpoints (the shared workdir: every node, every requeue)
        cache/<project>/               a Slurm run's project cache
        data/<project>/                the project's data entries (node.data.store; ``data:`` in higgsfield.yml)
            objects/<sha[:2]>/<sha256>   every file once, by content, read-only
            entries/<name>/versions/<version>/   a version: hard links to the objects
            entries/<name>/current -> versions/<version>   swapped atomically by each push

    ~/.cache/higgsfield/<project>/     an SSH node's project cache, mounted read-write into its containers
        experiments/<experiment>/<run>/   the run's checkpoints (:func:`checkpoint_dir`, HIGGSFIELD_CHECKPOINT_DIR)

Both sides spell these names from here, so a file the node writes is the file the
control side asks for (an SSH node through its invoker, a Slurm workdir directly).
Paths under the state dir are given relative to it, as POSIX strings (``projects/p/code``),
so the node joins them to its :class:`~pathlib.Path` and the control side to a remote
directory's string alike. The ``HIGGSFIELD_*`` variables a run's ranks get
(``RUN_DIR_VAR`` ...) are named here too: both runtimes and the Slurm task set them, the
training library reads them. So is the rule of which host of a Slurm allocation runs
which global rank (:func:`node_of_rank`), which the node side's Slurm task and the
control side's log reader both apply.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

#: Where a node keeps code, runs and logs unless higgsfield.yml's ``state_dir`` says otherwise.
DEFAULT_STATE_DIR = "~/.higgsfield"
RUNS = "runs"
VENV = "venv"                     # the invoker's own environment, installed by setup
WHEELS = "wheels"                 # setup's upload of the higgsfield wheel (and a wheelhouse)
TMP = "tmp"                       # setup's downloads
PROJECTS = "projects"
ENVS = "envs"
TRASH = "trash"
DATA = "data"                     # data/<project>/: data entries (node.data.store)
QUEUE = "queue.json"
QUEUE_LOCK = "queue.lock"
LOCK = ".lock"                    # a run's start lock (in its directory), an environment build's (in envs/<project>)
#: The top-level names of a node's state directory that are higgsfield's own: a data entry's ``dest:``
#: never replaces one.
STATE_OWN = (RUNS, VENV, WHEELS, TMP, PROJECTS, ENVS, TRASH, DATA, QUEUE, QUEUE_LOCK, LOCK)

CODE = "code"                     # under projects/<project>/
RELEASES = "releases"
DEPLOYED = "deployed.json"
IMAGE = "image.json"
BUILD_LOG = "build.log"
ENV_RECORD = "env.json"
ENV_BUILD_LOG = "env-build.log"

SLURM_CHECKPOINTS = "checkpoints"   # under a Slurm workdir
SLURM_CACHE = "cache"
HUB_META = ".cache"   # huggingface_hub's bookkeeping inside a snapshot's local_dir (a data entry drops it)

RECORD = "run.json"
SPEC = "spec.json"
KILL = "kill"
LOGS = "logs"
LAUNCHER_LOG = "launcher.log"

PROGRESS = "progress"
STACKS = "stacks"
STACKS_FILE = "stacks.json"
DRIFT_FACTS = "facts"          # a Slurm job's drift check: facts/<attempt>/<node>.json
DRIFT_VERDICT = "drift.json"   # and its verdict, facts/<attempt>/drift.json


def state_path(state_dir: str) -> Path:
    """The state directory, absolute: ``~`` expanded, a relative one relative to the home (as over SSH)."""
    p = Path(state_dir).expanduser()
    return p if p.is_absolute() else Path.home() / p


def project_dir(project: str) -> str:
    """``projects/<project>``: the project's deploys, image and environment records (relative to the state dir)."""
    return f"{PROJECTS}/{project}"


def data_dir(project: str) -> str:
    """``data/<project>``: the project's data entries, objects and versions (relative to the state dir)."""
    return f"{DATA}/{project}"


def code_dir(project: str) -> str:
    """``projects/<project>/code``: the link to the deployed tree (relative to the state dir)."""
    return f"{project_dir(project)}/{CODE}"


def env_record(project: str) -> str:
    """``projects/<project>/env.json``: the project environment's record (relative to the state dir)."""
    return f"{project_dir(project)}/{ENV_RECORD}"


def env_build_log(project: str) -> str:
    """``projects/<project>/env-build.log``: pip's output of the last build (relative to the state dir)."""
    return f"{project_dir(project)}/{ENV_BUILD_LOG}"


def envs_dir(project: str) -> str:
    """``envs/<project>``: the project environment's venvs, one per key (relative to the state dir)."""
    return f"{ENVS}/{project}"


def runs_dir(project: str) -> str:
    """``runs/<project>``: the project's run directories (relative to the state dir)."""
    return f"{RUNS}/{project}"


def run_dir(project: str, run: str) -> str:
    """``runs/<project>/<run>``: one run's directory (relative to the state dir)."""
    return f"{runs_dir(project)}/{run}"


def slurm_checkpoint_root(project: str) -> str:
    """``checkpoints/<project>``: a Slurm project's checkpoints (relative to the workdir, its state dir)."""
    return f"{SLURM_CHECKPOINTS}/{project}"


def slurm_checkpoint_dir(project: str, run: str) -> str:
    """``checkpoints/<project>/<run>``: a Slurm run's checkpoints (relative to the workdir)."""
    return f"{slurm_checkpoint_root(project)}/{run}"


def slurm_cache_dir(project: str) -> str:
    """``cache/<project>``: a Slurm project's cache (relative to the workdir)."""
    return f"{SLURM_CACHE}/{project}"


def cache_dir(project: str) -> Path:
    """``~/.cache/higgsfield/<project>``: an SSH node's project cache (the node user's home, read at call time)."""
    return Path.home() / ".cache" / "higgsfield" / project


EXPERIMENTS = "experiments"   # under cache_dir(project)


def checkpoint_dir(project: str, experiment: str, run: str) -> Path:
    """``~/.cache/higgsfield/<project>/experiments/<experiment>/<run>``: an SSH node's run's checkpoints
    (the original's layout; :mod:`higgsfield.checkpoint` writes there unless told another directory)."""
    return cache_dir(project) / EXPERIMENTS / experiment / run


def progress_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """The file rank ``rank`` writes its progress to (``STEP UNIXTIME``, rewritten in place)."""
    return Path(run_dir) / PROGRESS / f"rank{int(rank)}"


def work_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """The file rank ``rank`` writes its own work per step to (:mod:`higgsfield.contract.straggler`)."""
    return Path(run_dir) / PROGRESS / f"work{int(rank)}"


def stacks_dump_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """The file rank ``rank``'s faulthandler appends its threads' stacks to when signalled."""
    return Path(run_dir) / STACKS / f"rank{int(rank)}"


REQUEST = "request.json"
SECRETS = "secrets.json"
SCRIPT = "job.sh"
JOB = "job.json"
REQUEST_VERSION = 1   # of request.json: what the Slurm task reads

# The run's own environment variables, which every rank gets (the node side sets them, the training library
# reads them): its directory, its node's name, its checkpoint directory and mirror URL.
RUN_DIR_VAR = "HIGGSFIELD_RUN_DIR"
NODE_VAR = "HIGGSFIELD_NODE"
CHECKPOINT_DIR_VAR = "HIGGSFIELD_CHECKPOINT_DIR"
CHECKPOINT_MIRROR_VAR = "HIGGSFIELD_CHECKPOINT_MIRROR"


def mirror_path(url: str) -> str | None:
    """The node's directory of a path mirror (``/nfs/ckpt`` or ``file:///nfs/ckpt``); None for a remote URL.

    A path mirror is the one kind a container must be given (a bind mount at the same path): an
    object store or SFTP is reached over the network from inside it as from outside.
    """
    if url.startswith("file://"):
        url = url[len("file://"):]
    return url if url.startswith("/") else None


# -- which host of a Slurm allocation runs which rank ------------------------------------------------------

def _host_order(hosts: Sequence[str]) -> list[str]:
    # torchrun's c10d rendezvous orders the nodes by name (each is its own --local_addr), nproc ranks each
    return sorted(hosts)


def node_of_rank(hosts: Sequence[str], nproc: int, rank: int) -> str | None:
    """The host of a Slurm run that ran global rank ``rank`` (``nproc`` ranks per node); None when out of range."""
    order = _host_order(hosts)
    if nproc < 1 or not 0 <= rank < nproc * len(order):
        return None
    return order[rank // nproc]


def ranks_of_node(hosts: Sequence[str], nproc: int, node: str) -> range:
    """The global ranks of a Slurm run that ``node``'s workers have (empty when it is not one of ``hosts``)."""
    order = _host_order(hosts)
    if node not in order:
        return range(0)
    i = order.index(node)
    return range(i * nproc, (i + 1) * nproc)

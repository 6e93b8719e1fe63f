"""A run's directory by name: the one layout the node side writes and the control side reads.

::

    <state dir>/runs/<project>/<run>/
        run.json            the record (the node's supervisor writes it; status reads it)
        spec.json           the pinned RunSpec that every worker reads
        kill                the kill marker the supervisor watches
        logs/launcher.log   torchrun's own output; logs/rank<N>.log, .idx, .error.json, .done per rank
        progress/rank<N>    the rank's last reported step and its wall time (``higgsfield.training.progress``)
        stacks/rank<N>      where the rank's faulthandler dumps its threads when the node signals it
                            (``higgsfield.node.runs.stacks``); stacks/rank<N>.json: its pid and main thread
        stacks.json         every rank's stacks on this node, taken at a stall
        request.json, secrets.json, job.sh, job.json   a Slurm run's submission (the workdir is its state dir)

Both sides spell these names from here, so a file the node writes is the file the
control side asks for (an SSH node through its invoker, a Slurm workdir directly).
The ``HIGGSFIELD_*`` variables a run's ranks get (``RUN_DIR_VAR`` ...) are named here too:
both runtimes and the Slurm task set them, the training library reads them.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Where a node keeps code, runs and logs unless higgsfield.yml's ``state_dir`` says otherwise.
DEFAULT_STATE_DIR = "~/.higgsfield"
RUNS = "runs"
RECORD = "run.json"
SPEC = "spec.json"
KILL = "kill"
LOGS = "logs"
LAUNCHER_LOG = "launcher.log"

PROGRESS = "progress"
STACKS = "stacks"
STACKS_FILE = "stacks.json"


def state_path(state_dir: str) -> Path:
    """The state directory, absolute: ``~`` expanded, a relative one relative to the home (as over SSH)."""
    p = Path(state_dir).expanduser()
    return p if p.is_absolute() else Path.home() / p


def progress_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """The file rank ``rank`` writes its progress to (``STEP UNIXTIME``, rewritten in place)."""
    return Path(run_dir) / PROGRESS / f"rank{int(rank)}"


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

"""A run's directory by name: the one layout the node side writes and the control side reads.

::

    <state dir>/runs/<project>/<run>/
        run.json            the record (the node's supervisor writes it; status reads it)
        spec.json           the pinned RunSpec that every worker reads
        kill                the kill marker the supervisor watches
        logs/launcher.log   torchrun's own output; logs/rank<N>.log, .idx, .error.json, .done per rank
        request.json, secrets.json, job.sh, job.json   a Slurm run's submission (the workdir is its state dir)

Both sides spell these names from here, so a file the node writes is the file the
control side asks for (an SSH node through its invoker, a Slurm workdir directly).
"""

from __future__ import annotations

RUNS = "runs"
RECORD = "run.json"
SPEC = "spec.json"
KILL = "kill"
LOGS = "logs"
LAUNCHER_LOG = "launcher.log"

REQUEST = "request.json"
SECRETS = "secrets.json"
SCRIPT = "job.sh"
JOB = "job.json"
REQUEST_VERSION = 1   # of request.json: what the Slurm task reads

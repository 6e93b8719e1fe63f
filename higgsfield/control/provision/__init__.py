"""``higgsfield setup``: a declared list of idempotent steps (check, apply, verify), run on every node at once.

Use::

    from higgsfield.control.provision import provision
    report = asyncio.run(provision(cfg, dry_run=True))
    for line in report.failures(): print(line)

Steps, in order: ``os`` (Linux, passwordless sudo), ``docker`` (the distribution's
docker.io when absent), ``docker-group`` (the user in the docker group, reconnected),
``nvidia`` (the container toolkit where nvidia-smi finds GPUs), ``invoker`` (this
package at the control side's build, in ``<state_dir>/venv``, sent over SFTP),
``deploy-key`` (the GitHub deploy key + a managed ``~/.ssh/config`` block) and
``base-image`` (``docker.base_image`` pulled once). A Slurm cluster's login node gets
``slurm`` (the cluster accepts a run's job, the workdir is shared) and ``invoker``
instead (:mod:`higgsfield.control.provision.slurm`).
"""

from higgsfield.contract.errors import StepFailed
from higgsfield.control.provision.context import SetupOptions
from higgsfield.control.provision.runner import (
    SLURM_STEPS,
    STEPS,
    NodeReport,
    SetupReport,
    StepResult,
    provision,
    select_steps,
    steps_for,
)
from higgsfield.control.provision.step import Check, Outcome, Step

__all__ = ["SLURM_STEPS", "STEPS", "Check", "NodeReport", "Outcome", "SetupOptions", "SetupReport", "Step", "StepFailed",
           "StepResult", "provision", "select_steps", "steps_for"]

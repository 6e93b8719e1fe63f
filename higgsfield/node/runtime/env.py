"""torchrun's environment, built in one place: the run's own variables and the basics kept of the node's.

Every start of a run's torchrun builds its environment from these two: the process
runtime (:func:`higgsfield.node.runtime.torchrun.process_env`), the Docker runtime (only
the run's variables: :func:`~higgsfield.node.runtime.torchrun.container_env`) and the
task each node of a Slurm job runs (:func:`higgsfield.node.slurm_task.node_env`). Each adds
the run's secrets between the two, so a secret never overrides the run's own variables.

Plain arguments, no spec type: an SSH node passes its :class:`~higgsfield.node.state.placement.NodeRun`'s
fields, a Slurm node its :class:`~higgsfield.contract.slurmjob.PinnedSlurmRun`'s (whose node
is the one the task runs on, not node 0). Stdlib only, like the Slurm task that imports it.

Use::

    env = kept_basics(os.environ)
    env.update(secrets)
    env.update(run_variables(project="p", experiment="e", run="r", run_dir="/s/runs/p/r", node="n1"))
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from higgsfield.contract.layout import CHECKPOINT_DIR_VAR, CHECKPOINT_MIRROR_VAR, NODE_VAR, RUN_DIR_VAR

#: What a run keeps of the environment it is started from (plus every LC_* locale variable): nothing else
#: of it (an SSH agent socket, a login's tokens, whatever the node's shell exported) reaches user code.
KEPT_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR")


def kept_basics(base: Mapping[str, str], also: Iterable[str] = ()) -> dict[str, str]:
    """The variables of ``base`` a run keeps: :data:`KEPT_ENV`, ``LC_*``, and the names in ``also``."""
    keep = {*KEPT_ENV, *also}
    return {k: v for k, v in base.items() if k in keep or k.startswith("LC_")}


def run_variables(*, project: str, experiment: str, run: str, run_dir: str, node: str,
                  checkpoint_dir: str = "", checkpoint_mirror: str = "") -> dict[str, str]:
    """The run's own variables, which every rank gets (the training library reads them)."""
    env = {
        "PROJECT_NAME": project,
        "EXPERIMENT_NAME": experiment,
        "RUN_NAME": run,
        RUN_DIR_VAR: run_dir,
        NODE_VAR: node,
        "PYTHONUNBUFFERED": "1",
        # torchrun restarts over gloo fail to reconnect when the rendezvous store is shared.
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    if checkpoint_dir:
        env[CHECKPOINT_DIR_VAR] = checkpoint_dir
    if checkpoint_mirror:  # the URL only: its credentials are secrets, set beside it
        env[CHECKPOINT_MIRROR_VAR] = checkpoint_mirror
    return env

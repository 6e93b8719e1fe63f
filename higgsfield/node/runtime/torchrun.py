"""The torchrun command of a run, its environment, and the process runtime's handle on it.

Both runtimes run the same command (the Docker runtime inside the project's image)::

    python -m torch.distributed.run --nnodes N --node_rank i --nproc_per_node P \\
        --master_addr NODE0 --master_port PORT --max_restarts R -m higgsfield.node.entrypoint RUN_DIR

``PORT`` is the rendezvous port node 0 chose when every node of the run was admitted
(see :mod:`higgsfield.node.gang.coordinator`).

The process runtime gives torchrun a *minimal* environment: the locale, ``PATH``,
``HOME`` and the user's identity from the invoker's, then the run's own variables and
its secrets. Nothing else of the invoker's environment (an SSH agent socket, a
login's tokens, whatever the node's shell exported) reaches user code. Both halves are
built by :mod:`higgsfield.node.runtime.env`, as a Slurm node's task builds its own.

The run's processes are told apart from any other by psutil (:mod:`higgsfield.node.state.pids`):
torchrun by its recorded pid and start time, each worker by the pid it wrote to
``rank<N>.pid`` and the run directory in its environment (``HIGGSFIELD_RUN_DIR``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence

import psutil

from higgsfield.contract.layout import RUN_DIR_VAR
from higgsfield.node.runtime.env import kept_basics, run_variables
from higgsfield.node.state import pids
from higgsfield.node.state.placement import NodeRun
from higgsfield.node.state.records import RunDir


def argv(run: NodeRun, rd: RunDir, python: str, port: int) -> list[str]:
    """The torchrun command for this node (static rendezvous on node 0, at ``port``)."""
    spec = run.spec
    return [
        python, "-m", "torch.distributed.run",
        "--nnodes", str(spec.nnodes),
        "--node_rank", str(spec.node_rank),
        "--nproc_per_node", str(run.nproc),
        "--master_addr", spec.master_addr,
        "--master_port", str(port),
        "--max_restarts", str(spec.max_restarts),
        "-m", "higgsfield.node.entrypoint", str(rd.path),
    ]


def run_vars(run: NodeRun, rd: RunDir) -> dict[str, str]:
    """The run's own variables (both runtimes)."""
    from higgsfield.node.data.store import data_variables

    spec = run.spec
    env = run_variables(project=spec.project, experiment=spec.experiment, run=spec.run, run_dir=str(rd.path),
                        node=spec.node, checkpoint_dir=run.placement.checkpoint_dir,
                        checkpoint_mirror=spec.checkpoint_mirror)
    env.update(data_variables(rd.home, spec.project))   # each data entry's current version, read-only
    return env


def process_env(run: NodeRun, rd: RunDir, secrets: dict[str, str], gpu_ids: Sequence[int] = (),
                base: dict[str, str] | None = None) -> dict[str, str]:
    """The process runtime's environment: the kept basics of ``base`` (os.environ), the secrets, the run's.

    ``gpu_ids``: the GPUs the run holds on this node (``CUDA_VISIBLE_DEVICES``; none on a CPU node).
    """
    env = kept_basics(os.environ if base is None else base)
    env.update(secrets)
    env.update(run_vars(run, rd))
    if gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu_ids))
    return env


def container_env(run: NodeRun, rd: RunDir) -> dict[str, str]:
    """The container's configured environment: only the run's own variables (secrets come on stdin)."""
    from higgsfield.node.runtime.containers import INVOKER_MOUNT

    env = run_vars(run, rd)
    env.update({"HOME": "/tmp", "PYTHONPATH": INVOKER_MOUNT, "PYTHONDONTWRITEBYTECODE": "1"})
    return env


class ProcessRun:
    """torchrun as a process of its own session on this node (the process runtime).

    ``terminate`` asks it to stop (SIGTERM to torchrun, which stops its workers);
    ``kill`` ends everything of the run that is left: torchrun, its workers (each in a
    session of its own) and whatever they started.
    """

    def __init__(self, command: list[str], rd: RunDir, *, cwd: str | None, env: dict[str, str]) -> None:
        self.rd = rd
        self.proc = psutil.Popen(command, cwd=cwd, env=env, start_new_session=True)  # noqa: S603
        self.pid = self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def terminate(self, grace: float) -> None:
        pids.send([self.proc], signal.SIGTERM)

    def kill(self) -> None:
        pids.kill([self.proc, *workers(self.rd)])

    def cleanup(self) -> None:
        """After torchrun ended: nothing of the run outlives it (workers, their tees)."""
        self.kill()


def workers(rd: RunDir) -> list[psutil.Process]:
    """The run's live workers: the pids in ``rank<N>.pid`` whose process has this run dir in its environment."""
    out = []
    for p in rd.logs.glob("rank*.pid"):
        try:
            proc = pids.find(int(p.read_text().strip()))
            if proc is not None and proc.environ().get(RUN_DIR_VAR) == str(rd.path):
                out.append(proc)
        except (OSError, ValueError, psutil.Error):
            continue
    return out

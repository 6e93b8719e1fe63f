"""The torchrun command of a run, its environment, and the process runtime's handle on it.

Both runtimes run the same command (the Docker runtime inside the project's image)::

    python -m torch.distributed.run --nnodes N --node_rank i --nproc_per_node P \\
        --master_addr NODE0 --master_port PORT --max_restarts R -m higgsfield.entrypoint RUN_DIR

``PORT`` is the rendezvous port node 0 chose when every node of the run was admitted
(see :mod:`higgsfield.invoker.coordinator`).

The process runtime gives torchrun a *minimal* environment: the locale, ``PATH``,
``HOME`` and the user's identity from the invoker's, then the run's own variables and
its secrets. Nothing else of the invoker's environment (an SSH agent socket, a
login's tokens, whatever the node's shell exported) reaches user code.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

from higgsfield.invoker.records import RunDir

# What the process runtime keeps of the invoker's environment (plus every LC_* locale variable).
KEPT_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR")


def argv(spec: dict[str, Any], rd: RunDir, python: str, port: int) -> list[str]:
    """The torchrun command for this node (static rendezvous on node 0, at ``port``)."""
    return [
        python, "-m", "torch.distributed.run",
        "--nnodes", str(spec["nnodes"]),
        "--node_rank", str(spec["node_rank"]),
        "--nproc_per_node", str(spec["nproc"]),
        "--master_addr", str(spec["master_addr"]),
        "--master_port", str(port),
        "--max_restarts", str(spec.get("max_restarts", 0)),
        "-m", "higgsfield.entrypoint", str(rd.path),
    ]


def run_vars(spec: dict[str, Any], rd: RunDir) -> dict[str, str]:
    """The run's own variables (both runtimes)."""
    env = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
    env.update({
        "PROJECT_NAME": spec["project"],
        "EXPERIMENT_NAME": spec["experiment"],
        "RUN_NAME": spec["run"],
        "HIGGSFIELD_RUN_DIR": str(rd.path),
        "HIGGSFIELD_NODE": str(spec.get("node", "")),
        "PYTHONUNBUFFERED": "1",
        # torchrun restarts over gloo fail to reconnect when the rendezvous store is shared.
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    })
    if spec.get("checkpoint_dir"):
        env["HIGGSFIELD_CHECKPOINT_DIR"] = str(spec["checkpoint_dir"])
    return env


def process_env(spec: dict[str, Any], rd: RunDir, secrets: dict[str, str],
                base: dict[str, str] | None = None) -> dict[str, str]:
    """The process runtime's environment: the kept basics of ``base`` (os.environ), the secrets, the run's."""
    src = os.environ if base is None else base
    env = {k: v for k, v in src.items() if k in KEPT_ENV or k.startswith("LC_")}
    env.update(secrets)
    env.update(run_vars(spec, rd))
    if spec.get("cuda_visible_devices") is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(spec["cuda_visible_devices"])
    return env


def container_env(spec: dict[str, Any], rd: RunDir) -> dict[str, str]:
    """The container's configured environment: only the run's own variables (secrets come on stdin)."""
    from higgsfield.invoker.containers import INVOKER_MOUNT

    env = run_vars(spec, rd)
    env.update({"HOME": "/tmp", "PYTHONPATH": INVOKER_MOUNT, "PYTHONDONTWRITEBYTECODE": "1"})
    return env


class ProcessRun:
    """torchrun as a process of its own session on this node (the process runtime).

    ``terminate`` asks it to stop (SIGTERM to its process group: torchrun stops its
    workers); ``kill`` ends everything of the run that is left, workers included.
    """

    def __init__(self, command: list[str], rd: RunDir, *, cwd: str | None, env: dict[str, str]) -> None:
        self.rd = rd
        self.proc = subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True)  # noqa: S603
        self.pid = self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self, grace: float) -> None:
        signal_group(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        kill_workers(self.rd, signal.SIGKILL)
        signal_group(self.pid, signal.SIGKILL)

    def cleanup(self) -> None:
        """After torchrun ended: nothing of the run outlives it (workers, their tees)."""
        self.kill()


def signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_workers(rd: RunDir, sig: int) -> None:
    """Signal every worker that recorded its pid and still belongs to this run."""
    for p in rd.logs.glob("rank*.pid"):
        try:
            pid = int(p.read_text().strip())
        except (OSError, ValueError):
            continue
        if belongs(pid, rd):
            signal_group(pid, sig)


def belongs(pid: int, rd: RunDir) -> bool:
    """True when ``pid`` is a live process of this run (guards against pid reuse)."""
    import psutil

    try:
        return psutil.Process(pid).environ().get("HIGGSFIELD_RUN_DIR") == str(rd.path)
    except (psutil.Error, OSError):
        return False

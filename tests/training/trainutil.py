"""Helpers for the training tests (imported by name: tests/ has no __init__.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = Path(__file__).resolve().parent / "launch.py"
#: A model and batch small enough for 2 cores shared with other test runs.
TINY = {"hidden": 64, "layers": 2, "global_batch": 8, "eval_every": 0, "lr": 1e-2}
#: The schedule of the launch two modules share (conftest.py's ``full_2x2``): 12 steps, a checkpoint every 4,
#: cut after step 9.
SHARED_STEPS, SHARED_EVERY, SHARED_CUT = 12, 4, 9


def torchrun(nproc: int, tmp: Path, params: dict[str, Any], *, max_restarts: int = 0, run: str = "r",
             timeout: float = 420, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str],
                                                                             list[dict[str, Any]]]:
    """Run tiny_llama on ``nproc`` processes; returns the process and rank 0's metrics lines."""
    metrics = tmp / f"metrics-{run}-{nproc}-{len(list(tmp.glob('metrics-*')))}.jsonl"
    args = {**TINY, **params, "metrics_file": str(metrics)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "--max-restarts", str(max_restarts), str(LAUNCH), "tiny_llama", *[f"{k}={v}" for k, v in args.items()]]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PROJECT_NAME": "test", "EXPERIMENT_NAME": "tiny_llama",
                "RUN_NAME": run, "HIGGSFIELD_CHECKPOINT_DIR": str(tmp / "ckpt" / run),
                # torchrun restarts with gloo need their own store (pytorch/pytorch#135712).
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "DS_ACCELERATOR": "cpu",
                "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)  # noqa: S603
    if proc.returncode != 0 and "EADDRINUSE" in proc.stderr:
        # --standalone's port was free when torchrun picked it and taken before its store bound it (the other
        # lane's processes draw from the same ephemeral range; one CI run lost a test to it): nothing ran yet,
        # so the launch is made again, once
        metrics.unlink(missing_ok=True)
        proc = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True,  # noqa: S603
                              timeout=timeout)
    lines = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    return proc, lines


def ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


def losses(lines: list[dict[str, Any]]) -> dict[int, float]:
    """step -> loss, the last attempt winning (a restarted run replays steps after its checkpoint)."""
    return {m["step"]: m["loss"] for m in lines}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_two_nodes(tmp: Path, params: dict[str, Any], run: str, env: dict[str, str] | None = None,
                    max_restarts: int = 0) -> tuple[list[subprocess.Popen[str]], Path]:
    """tiny_llama on 2 torchrun agents x 2 ranks (``--nnodes 2`` on 127.0.0.1), node N's checkpoints in
    ``tmp/nodeN/<run>``: two "nodes" that share no disk. Each agent in its own session, so a kill takes
    its workers too; returns the agents and the file rank 0 appends its metrics to."""
    metrics = tmp / f"metrics-{run}-{len(list(tmp.glob('metrics-*')))}.jsonl"
    args = [f"{k}={v}" for k, v in {**TINY, **params, "metrics_file": str(metrics)}.items()]
    port = free_port()
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
               "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(port),
               "--max-restarts", str(max_restarts), str(LAUNCH), "tiny_llama", *args]
        full = {**os.environ, "OMP_NUM_THREADS": "1", "PROJECT_NAME": "test", "EXPERIMENT_NAME": "tiny_llama",
                "RUN_NAME": run, "HIGGSFIELD_CHECKPOINT_DIR": str(tmp / f"node{node}" / run),
                "HIGGSFIELD_NODE": f"fake{node}", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT), **(env or {})}
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=full, stdout=subprocess.PIPE,  # noqa: S603
                                      stderr=subprocess.PIPE, text=True, start_new_session=True))
    return procs, metrics


def kill_sessions(procs: list[subprocess.Popen[str]], timeout: float = 30) -> None:
    """SIGKILL each agent's whole tree, as a lost machine would, and wait for it, ``timeout`` s at most.

    The agent's session is not all of it: torchrun starts each worker in a session of its own, so the
    workers (found while the agent still is their parent) and their process groups are killed too. A
    worker left alive would hold the agent's stdout and keep ``communicate`` from ever seeing its end.
    """
    ours = os.getpgrp()
    tree: list[psutil.Process] = []
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGSTOP)  # an agent that restarts its workers starts none while stopped
            tree += psutil.Process(p.pid).children(recursive=True)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    for pid in [p.pid for p in procs] + [c.pid for c in tree]:
        try:
            group = os.getpgid(pid)
            if group != ours:
                os.killpg(group, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, alive = psutil.wait_procs(tree, timeout=timeout)
    assert not alive, f"still alive {timeout} s after SIGKILL: {alive}"
    for p in procs:
        p.communicate(timeout=timeout)


def finish_two_nodes(procs: list[subprocess.Popen[str]], metrics: Path, timeout: float = 400
                     ) -> tuple[list[subprocess.CompletedProcess[str]], list[dict[str, Any]]]:
    """Wait for both agents (both killed if one outlasts ``timeout``); their outcomes and rank 0's metrics."""
    done = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_sessions(procs)
            raise
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    lines = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    return done, lines

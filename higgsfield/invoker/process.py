"""The process runtime: start, supervise and stop a run's torchrun on this node.

``launch`` writes the spec and record, then starts a detached *supervisor*
(``higgsfield invoker supervise``) that owns the run: it starts torchrun in its own
session, waits, and writes the final state. Secrets reach the supervisor on its
stdin and live only in the run's environment. ``kill`` asks torchrun to stop
(SIGTERM to its process group; torchrun forwards it to the workers), then kills
whatever is left, workers included (each worker records its pid), so nothing
outlives a kill.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from higgsfield.errors import RunError
from higgsfield.invoker.records import (
    ACTIVE,
    FAILED,
    KILLED,
    RUNNING,
    STARTING,
    SUCCEEDED,
    RunDir,
    RunRecord,
    first_failure,
)


def detect_gpus() -> int:
    """Number of GPUs ``nvidia-smi -L`` lists (0 without a driver)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def resolve_nproc(nproc: Any) -> int:
    if nproc in (None, "auto"):
        return max(1, detect_gpus())
    return int(nproc)


def torchrun_argv(spec: dict[str, Any], rd: RunDir, python: str) -> list[str]:
    """The torchrun command for this node (static rendezvous on node 0)."""
    return [
        python, "-m", "torch.distributed.run",
        "--nnodes", str(spec["nnodes"]),
        "--node_rank", str(spec["node_rank"]),
        "--nproc_per_node", str(spec["nproc"]),
        "--master_addr", str(spec["master_addr"]),
        "--master_port", str(spec["master_port"]),
        "--max_restarts", str(spec.get("max_restarts", 0)),
        "-m", "higgsfield.entrypoint", str(rd.path),
    ]


def run_env(spec: dict[str, Any], rd: RunDir, secrets: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
    env.update(secrets)
    env.update({
        "PROJECT_NAME": spec["project"],
        "EXPERIMENT_NAME": spec["experiment"],
        "RUN_NAME": spec["run"],
        "HIGGSFIELD_RUN_DIR": str(rd.path),
        "PYTHONUNBUFFERED": "1",
        # torchrun restarts over gloo fail to reconnect when the rendezvous store is shared.
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    })
    if spec.get("checkpoint_dir"):
        env["HIGGSFIELD_CHECKPOINT_DIR"] = str(spec["checkpoint_dir"])
    if spec.get("cuda_visible_devices") is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(spec["cuda_visible_devices"])
    return env


def launch(state_dir: Path, spec: dict[str, Any], secrets: dict[str, str]) -> RunRecord:
    """Record the run and start its supervisor; returns the record (state ``starting``)."""
    rd = RunDir(state_dir, spec["project"], spec["run"])
    if rd.exists():
        old = rd.read()
        if old.state in ACTIVE:
            raise RunError(f"run '{spec['run']}' is already {old.state} on {spec['node']}: "
                           f"pick another --run-name or kill it first")
    rd.logs.mkdir(parents=True, exist_ok=True)
    rd.kill_marker.unlink(missing_ok=True)
    spec = {**spec, "nproc": resolve_nproc(spec.get("nproc"))}
    from higgsfield.invoker.records import write_json

    write_json(rd.spec_path, spec)
    record = RunRecord(project=spec["project"], experiment=spec["experiment"], run=spec["run"],
                       node=spec["node"], node_rank=int(spec["node_rank"]), nnodes=int(spec["nnodes"]),
                       nproc=int(spec["nproc"]), state=STARTING, runtime="process")
    launcher_log = open(rd.logs / "launcher.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen(  # noqa: S603 - argv list, no shell
            [sys.executable, "-m", "higgsfield", "invoker", "--state-dir", str(state_dir), "supervise",
             spec["project"], spec["run"]],
            stdin=subprocess.PIPE, stdout=launcher_log, stderr=subprocess.STDOUT,
            cwd=spec.get("code_dir") or None, start_new_session=True)
    finally:
        launcher_log.close()
    record.pids["supervisor"] = proc.pid
    rd.write(record)
    # The supervisor blocks on stdin until this write is done, so the record above is never raced.
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(secrets).encode())
    proc.stdin.close()
    return record


def supervise(state_dir: Path, project: str, run: str) -> int:
    """Body of the supervisor process: run torchrun to the end and record how it ended."""
    secrets = json.loads(sys.stdin.read() or "{}")
    rd = RunDir(state_dir, project, run)
    spec = rd.spec()
    record = rd.read()
    python = spec.get("python") or sys.executable
    argv = torchrun_argv(spec, rd, python)
    record.command = argv
    if rd.kill_marker.exists():
        record.state, record.ended_at = KILLED, time.time()
        rd.write(record)
        return 0
    proc = subprocess.Popen(argv, cwd=spec.get("code_dir") or None,  # noqa: S603
                            env=run_env(spec, rd, secrets), start_new_session=True)
    del secrets
    record.pids["launcher"] = proc.pid
    record.state, record.started_at = RUNNING, time.time()
    rd.write(record)

    def forward(signum: int, _frame: Any) -> None:
        _signal_group(proc.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    rc = proc.wait()
    _kill_workers(rd, signal.SIGKILL)
    _signal_group(proc.pid, signal.SIGKILL)
    record = rd.read()
    record.exit_code = rc
    record.ended_at = time.time()
    if rd.kill_marker.exists():
        record.state = KILLED
    elif rc == 0:
        record.state = SUCCEEDED
    else:
        record.state = FAILED
        failure = first_failure(rd)
        if failure:
            record.failed_rank, record.failed_at = failure
        record.reason = f"torchrun exited {rc}"
    rd.write(record)
    return 0


def kill(state_dir: Path, project: str, run: str, grace: float = 3.0) -> RunRecord:
    """Stop the run: SIGTERM, then SIGKILL after ``grace`` seconds; returns the final record."""
    rd = RunDir(state_dir, project, run)
    if not rd.exists():
        raise RunError(f"no run '{run}' of project '{project}'")
    record = rd.read()
    if record.terminal:
        return record
    rd.kill_marker.touch()
    launcher = record.pids.get("launcher")
    if launcher:
        _signal_group(launcher, signal.SIGTERM)
    _kill_workers(rd, signal.SIGTERM)
    deadline = time.time() + grace
    while time.time() < deadline:
        if rd.read().terminal:
            return rd.read()
        time.sleep(0.1)
    record = rd.read()
    for pid in (record.pids.get("launcher"), record.pids.get("supervisor")):
        if pid:
            _signal_group(pid, signal.SIGKILL)
    _kill_workers(rd, signal.SIGKILL)
    deadline = time.time() + 2.0
    while time.time() < deadline and not rd.read().terminal:
        time.sleep(0.1)
    record = rd.read()
    if not record.terminal:  # the supervisor is gone: finish the record ourselves
        record.state, record.ended_at = KILLED, time.time()
        rd.write(record)
    return record


def refresh(rd: RunDir) -> RunRecord:
    """The record, marked failed if its supervisor died without saying so (e.g. a reboot)."""
    record = rd.read()
    if record.state in (STARTING, RUNNING):
        sup = record.pids.get("supervisor")
        if sup and not _alive(sup) and time.time() - record.created_at > 5:
            record = rd.read()
            if not record.terminal:
                record.state = KILLED if rd.kill_marker.exists() else FAILED
                record.reason = record.reason or "the supervisor process disappeared"
                record.ended_at = time.time()
                rd.write(record)
    return record


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_workers(rd: RunDir, sig: int) -> None:
    """Signal every worker that recorded its pid and still belongs to this run."""
    for p in rd.logs.glob("rank*.pid"):
        try:
            pid = int(p.read_text().strip())
        except (OSError, ValueError):
            continue
        if _belongs(pid, rd):
            _signal_group(pid, sig)


def _belongs(pid: int, rd: RunDir) -> bool:
    """True when ``pid`` is a live process of this run (guards against pid reuse)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"HIGGSFIELD_RUN_DIR={rd.path}".encode() in f.read().split(b"\0")
    except OSError:
        return False

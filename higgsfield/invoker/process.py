"""A run's start, kill and refresh on one node (its life in between: :mod:`higgsfield.invoker.supervisor`).

``launch`` checks what it can at once (an active run of the same name, the image,
the deployed code, GPUs), writes the spec and record, then starts a detached
*supervisor* (``higgsfield invoker supervise``) that owns the run. On node 0 it
first binds the port of the run's coordinator (:mod:`higgsfield.invoker.coordinator`)
and hands the listening socket to the supervisor, so the port it returns to the
control side is already taken when the other nodes are started with it.

Secrets and the run's coordinator token reach the supervisor on its stdin and live
only in memory and the run's environment, never in a file on the node: the process
runtime passes secrets in torchrun's environment; the Docker runtime writes them to
the container's stdin, where its launcher (:mod:`higgsfield.invoker.launch`) puts
them in the environment and becomes torchrun, so they never show in ``docker
inspect`` either.

Pids are recorded with their start times (:mod:`higgsfield.invoker.pids`): after a
reboot or a long time, a recorded pid that now names another process is never
signalled nor taken for the run's. Two starts of one run name are serialised by a
per-run ``flock``, so only one of them can pass the "already active" check.

``kill`` marks the run, asks torchrun to stop (SIGTERM to its process group, or
``docker stop``), then kills whatever is left, workers and containers included, so
nothing outlives a kill. The runtime is chosen per node: ``runtime: docker``,
``process``, or ``auto`` (Docker when the engine answers and the project has an image
on this node, else processes). Everything a start writes is private to the node
user (umask 0077; the run's directories 0700).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from higgsfield.errors import RunError
from higgsfield.invoker import pids, queue
from higgsfield.invoker.locks import exclusive
from higgsfield.invoker.records import (
    ACTIVE,
    FAILED,
    KILLED,
    QUEUED,
    STARTING,
    RunDir,
    RunRecord,
    write_json,
)
from higgsfield.invoker.supervisor import finish
from higgsfield.invoker.torchrun import kill_workers, signal_group
from higgsfield.runspec import RunSpec

STOP_GRACE_S = 3.0


def detect_gpus() -> int:
    """Number of GPUs ``nvidia-smi -L`` lists (0 without a driver)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False)  # noqa: S603
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def resolve_nproc(nproc: Any, gpus: int) -> int:
    """Processes for this node: ``auto`` is one per GPU (one without GPUs)."""
    if nproc in (None, "auto"):
        return max(1, gpus)
    return int(nproc)


# -- launch -------------------------------------------------------------------

def _home_path(p: str | os.PathLike[str]) -> Path:
    path = Path(p).expanduser()
    return path if path.is_absolute() else Path.home() / path


def choose_runtime(state_dir: Path, spec: dict[str, Any]) -> tuple[str, str | None]:
    """("docker", image) or ("process", None) for this node, per ``spec['runtime']``."""
    from higgsfield.invoker import containers, deploy

    wanted = spec.get("runtime") or "auto"
    if wanted == "process":
        return "process", None
    image = deploy.current_image(state_dir, spec["project"])
    if wanted == "docker":
        if not containers.available():
            raise RunError("runtime 'docker' but no Docker engine answers on this node "
                           "(is the user in the docker group? run 'higgsfield setup')")
        if image is None or not containers.image_exists(image):
            raise RunError(f"no image of project '{spec['project']}' on this node: run 'higgsfield deploy'")
        return "docker", image
    if image and containers.available() and containers.image_exists(image):
        return "docker", image
    return "process", None


def _run_lock(rd: RunDir) -> contextlib.AbstractContextManager[None]:
    """An exclusive ``flock`` of the run's ``.lock`` (held while a start checks and records the run)."""
    rd.make()
    return exclusive(rd.path / ".lock")


def launch(state_dir: Path, run_spec: RunSpec, secrets: dict[str, str], token: str = "") -> RunRecord:
    """Check, record the run and start its supervisor; returns the record (state ``starting``).

    ``token`` authenticates the run's nodes to its coordinator (node 0's record
    carries the coordinator's port in ``coord_port``). Two starts of the same run
    name at once are serialised (a per-run lock): the second finds the first's record
    and is refused.
    """
    os.umask(0o077)
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        state_dir.chmod(0o700)
    spec = {**run_spec.to_dict(), "nnodes": run_spec.nnodes}
    rd = RunDir(state_dir, run_spec.project, run_spec.run)
    with _run_lock(rd):
        return _launch(state_dir, rd, spec, secrets, token)


def _launch(state_dir: Path, rd: RunDir, spec: dict[str, Any], secrets: dict[str, str], token: str) -> RunRecord:
    if rd.exists():
        old = refresh(rd)
        if old.state in ACTIVE:
            raise RunError(f"run '{spec['run']}' is already {old.state} on {spec['node']}: "
                           f"pick another --run-name or kill it first")
    code_dir = _home_path(spec.get("code_dir") or ".")
    if not code_dir.is_dir():
        raise RunError(f"project '{spec['project']}' is not deployed on this node ({code_dir} is missing): "
                       "run 'higgsfield deploy'")
    runtime, image = choose_runtime(state_dir, spec)
    if runtime == "process":  # torchrun in the project environment that deploy built (never the invoker's venv)
        from higgsfield.invoker.environment import python_for_run

        spec = {**spec, "python": python_for_run(state_dir, spec["project"], code_dir)}
    gpus = detect_gpus()
    nproc = resolve_nproc(spec.get("nproc"), gpus)
    cap = queue.capacity(gpus)
    if cap.gpus and nproc > cap.slots:
        raise RunError(f"nproc_per_node {nproc} > {cap.slots} GPU(s) on this node")
    from higgsfield.invoker.containers import container_name

    cache_dir = Path.home() / ".cache" / "higgsfield" / spec["project"]
    spec = {
        **spec, "nproc": nproc, "runtime": runtime, "image": image, "gpus": gpus,
        "code_dir": str(code_dir.resolve()),  # pins the release: a later deploy does not change a running run
        "cache_dir": str(cache_dir),
        "checkpoint_dir": spec.get("checkpoint_dir")
        or str(cache_dir / "experiments" / spec["experiment"] / spec["run"]),
        "container": container_name(spec["project"], spec["experiment"], spec["run"], str(spec["node"])),
        "stop_grace": STOP_GRACE_S,
    }
    spec.setdefault("submitted_at", time.time())
    # A re-used run name starts afresh (its checkpoints stay): old logs and markers go.
    for p in (rd.kill_marker, rd.legacy_secrets_path):
        p.unlink(missing_ok=True)
    if rd.logs.is_dir():
        for p in rd.logs.glob("rank*.*"):
            if p.suffix in (".pid", ".json", ".done"):
                p.unlink(missing_ok=True)
    rd.make()
    listener = None
    if int(spec["node_rank"]) == 0:  # node 0 hosts the run's coordinator: its port is taken from now on
        from higgsfield.invoker.coordinator import listen

        listener = listen(queue.reserved_ports(state_dir))
        spec["coord_port"] = listener.getsockname()[1]
    write_json(rd.spec_path, spec)
    record = RunRecord(project=spec["project"], experiment=spec["experiment"], run=spec["run"],
                       node=spec["node"], node_rank=int(spec["node_rank"]), nnodes=int(spec["nnodes"]),
                       nproc=nproc, state=STARTING, runtime=runtime, image=image,
                       exclusive=bool(spec.get("exclusive")), coord_port=spec.get("coord_port"),
                       container=spec["container"] if runtime == "docker" else None)
    argv = [sys.executable, "-m", "higgsfield", "invoker", "--state-dir", str(state_dir), "supervise",
            spec["project"], spec["run"]]
    if listener is not None:
        argv += ["--listen-fd", str(listener.fileno())]
    launcher_log = open(rd.logs / "launcher.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen(  # noqa: S603 - argv list, no shell
            argv, stdin=subprocess.PIPE, stdout=launcher_log, stderr=subprocess.STDOUT,
            cwd=spec["code_dir"], start_new_session=True,
            pass_fds=(listener.fileno(),) if listener is not None else ())
    finally:
        launcher_log.close()
        if listener is not None:
            listener.close()  # the supervisor has its own copy
    _record_pid(record, "supervisor", proc.pid)
    rd.write(record)
    # The supervisor blocks on stdin until this write is done, so the record above is never raced.
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"secrets": secrets, "token": token}).encode())
    proc.stdin.close()
    return record


def _record_pid(record: RunRecord, role: str, pid: int) -> None:
    record.pids[role] = pid
    start = pids.start_time(pid)
    if start is not None:
        record.pid_starts[role] = start


# -- kill ---------------------------------------------------------------------

def kill(state_dir: Path, project: str, run: str, grace: float = STOP_GRACE_S) -> RunRecord:
    """Stop the run: SIGTERM (``docker stop``), then SIGKILL after ``grace`` seconds; returns the final record.

    The run's supervisor tells the run's coordinator, which stops the run on its other
    nodes too (as killed), should this kill not reach them.
    """
    rd = RunDir(state_dir, project, run)
    if not rd.exists():
        raise RunError(f"no run '{run}' of project '{project}'")
    record = rd.read()
    if record.terminal:
        return record
    rd.kill_marker.touch()
    if record.runtime == "docker":
        _stop_container(rd, record, grace)
    _signal_recorded(record, "launcher", signal.SIGTERM, group=True)
    kill_workers(rd, signal.SIGTERM)
    if record.state in (QUEUED, STARTING):
        _signal_recorded(record, "supervisor", signal.SIGTERM)  # a queued supervisor stops waiting at once
    deadline = time.time() + grace
    while time.time() < deadline:
        if rd.read().terminal:
            return refresh(rd)
        time.sleep(0.1)
    record = rd.read()
    for role in ("launcher", "supervisor"):
        _signal_recorded(record, role, signal.SIGKILL, group=True)
    kill_workers(rd, signal.SIGKILL)
    if record.runtime == "docker":
        _stop_container(rd, record, 0)
    deadline = time.time() + 2.0
    while time.time() < deadline and not rd.read().terminal:
        time.sleep(0.1)
    if not rd.read().terminal:  # the supervisor is gone: finish the record ourselves
        finish(rd, KILLED)
    queue.release(state_dir, project, run)
    return rd.read()


def kill_target(state_dir: Path, project: str, target: str, grace: float = STOP_GRACE_S) -> dict[str, Any]:
    """Kill the active runs ``target`` names on this node (a run name, else an experiment), all at once.

    Returns ``{"matched": N, "killed": [final records]}``: one call per node is all a
    kill costs the control side.
    """
    from concurrent.futures import ThreadPoolExecutor

    from higgsfield.invoker.records import list_runs

    rds = list_runs(state_dir, project)
    chosen = [rd for rd in rds if rd.path.name == target]
    if not chosen:
        chosen = [rd for rd in rds if _experiment_of(rd) == target]
    active = [rd for rd in chosen if refresh(rd).state in ACTIVE]
    if not active:
        return {"matched": len(chosen), "killed": []}
    with ThreadPoolExecutor(max_workers=len(active)) as pool:
        records = list(pool.map(lambda rd: kill(state_dir, project, rd.path.name, grace), active))
    return {"matched": len(chosen), "killed": [r.to_dict() for r in records]}


def _experiment_of(rd: RunDir) -> str | None:
    try:
        return rd.read().experiment
    except (OSError, ValueError):
        return None


def _stop_container(rd: RunDir, record: RunRecord, grace: float) -> None:
    from higgsfield.invoker import containers

    with contextlib.suppress(Exception):
        containers.stop_run_containers(rd, record.container, grace=grace)


def refresh(rd: RunDir) -> RunRecord:
    """The record, marked failed if its supervisor died without saying so (e.g. a reboot).

    Whatever the dead supervisor left (a container, workers) is stopped, so a crash
    leaves no orphans.
    """
    record = rd.read()
    if record.state in ACTIVE:
        sup = record.pids.get("supervisor")
        if sup and not pids.alive(sup, record.pid_starts.get("supervisor")) and time.time() - record.created_at > 5:
            record = rd.read()
            if not record.terminal:
                if record.runtime == "docker":
                    _stop_container(rd, record, 1)
                kill_workers(rd, signal.SIGKILL)
                record.reason = record.reason or "the supervisor process disappeared"
                rd.write(record)
                record = finish(rd, KILLED if rd.kill_marker.exists() else FAILED)
    return record


def _signal_recorded(record: RunRecord, role: str, sig: int, *, group: bool = False) -> None:
    """Signal the recorded ``role`` pid (its process group with ``group``), unless the pid was reused.

    A pid whose process is gone is still signalled as a group: the run's leftover
    group members keep that number as their group id (the kernel does not hand it out
    while the group exists).
    """
    pid = record.pids.get(role)
    if not pid or pids.reused(pid, record.pid_starts.get(role)):
        return
    if group:
        signal_group(pid, sig)
    else:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)

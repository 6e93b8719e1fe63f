"""A run's life on one node: launch, supervise (queue, then Docker or plain processes), kill, refresh.

``launch`` checks what it can at once (an active run of the same name, the image,
the deployed code, GPUs), writes the spec and record, then starts a detached
*supervisor* (``higgsfield invoker supervise``) that owns the run:

1. it waits in the node's queue (state ``queued``) until its slots are free
   (:mod:`higgsfield.invoker.queue`);
2. it runs torchrun: in a container (:mod:`higgsfield.invoker.containers`) with the
   Docker runtime, or in its own session with the process runtime;
3. it waits, releases the slots and writes the final state (succeeded, failed with
   the rank that failed first, or killed).

Secrets reach the supervisor on its stdin and live only in the run's environment, never
in a file on the node: the process runtime passes them in torchrun's environment; the
Docker runtime writes them to the container's stdin, where its launcher
(:mod:`higgsfield.invoker.launch`) puts them in the environment and becomes torchrun,
so they never show in ``docker inspect`` either.

Pids are recorded with their start times (:mod:`higgsfield.invoker.pids`): after a
reboot or a long time, a recorded pid that now names another process is never
signalled nor taken for the run's. Two starts of one run name are serialised by a
per-run ``flock``, so only one of them can pass the "already active" check.

``kill`` marks the run, asks torchrun to stop (SIGTERM to its process group, or
``docker stop``), then kills whatever is left, workers and containers included, so
nothing outlives a kill. The runtime is chosen per node: ``runtime: docker``,
``process``, or ``auto`` (Docker when the engine answers and the project has an image
on this node, else processes).
"""

from __future__ import annotations

import contextlib
import fcntl
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
from higgsfield.invoker.records import (
    ACTIVE,
    FAILED,
    KILLED,
    QUEUED,
    RUNNING,
    STARTING,
    SUCCEEDED,
    RunDir,
    RunRecord,
    first_failure,
    write_json,
)

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


def _run_vars(spec: dict[str, Any], rd: RunDir) -> dict[str, str]:
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


def run_env(spec: dict[str, Any], rd: RunDir, secrets: dict[str, str]) -> dict[str, str]:
    """The environment of the process runtime's torchrun: the invoker's, plus the run's and the secrets."""
    env = dict(os.environ)
    env.update(secrets)
    env.update(_run_vars(spec, rd))
    if spec.get("cuda_visible_devices") is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(spec["cuda_visible_devices"])
    return env


def container_env(spec: dict[str, Any], rd: RunDir) -> dict[str, str]:
    """The container's configured environment: only the run's own variables (secrets come on stdin)."""
    from higgsfield.invoker.containers import INVOKER_MOUNT

    env = _run_vars(spec, rd)
    env.update({"HOME": "/tmp", "PYTHONPATH": INVOKER_MOUNT, "PYTHONDONTWRITEBYTECODE": "1"})
    return env


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


@contextlib.contextmanager
def _run_lock(rd: RunDir) -> Any:
    """An exclusive ``flock`` of the run's ``.lock`` (held while a start checks and records the run)."""
    rd.path.mkdir(parents=True, exist_ok=True)
    fd = os.open(rd.path / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def launch(state_dir: Path, spec: dict[str, Any], secrets: dict[str, str]) -> RunRecord:
    """Check, record the run and start its supervisor; returns the record (state ``starting``).

    Two starts of the same run name at once are serialised (a per-run lock): the second
    finds the first's record and is refused.
    """
    rd = RunDir(state_dir, spec["project"], spec["run"])
    with _run_lock(rd):
        return _launch(state_dir, rd, spec, secrets)


def _launch(state_dir: Path, rd: RunDir, spec: dict[str, Any], secrets: dict[str, str]) -> RunRecord:
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
    for p in (rd.kill_marker, rd.peer_lost_path, rd.legacy_secrets_path):
        p.unlink(missing_ok=True)
    if rd.logs.is_dir():
        for p in rd.logs.glob("rank*.*"):
            if p.suffix in (".pid", ".json"):
                p.unlink(missing_ok=True)
    rd.logs.mkdir(parents=True, exist_ok=True)
    write_json(rd.spec_path, spec)
    record = RunRecord(project=spec["project"], experiment=spec["experiment"], run=spec["run"],
                       node=spec["node"], node_rank=int(spec["node_rank"]), nnodes=int(spec["nnodes"]),
                       nproc=nproc, state=STARTING, runtime=runtime, image=image,
                       exclusive=bool(spec.get("exclusive")),
                       container=spec["container"] if runtime == "docker" else None)
    launcher_log = open(rd.logs / "launcher.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen(  # noqa: S603 - argv list, no shell
            [sys.executable, "-m", "higgsfield", "invoker", "--state-dir", str(state_dir), "supervise",
             spec["project"], spec["run"]],
            stdin=subprocess.PIPE, stdout=launcher_log, stderr=subprocess.STDOUT,
            cwd=spec["code_dir"], start_new_session=True)
    finally:
        launcher_log.close()
    _record_pid(record, "supervisor", proc.pid)
    rd.write(record)
    # The supervisor blocks on stdin until this write is done, so the record above is never raced.
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(secrets).encode())
    proc.stdin.close()
    return record


# -- supervise ----------------------------------------------------------------

def _say(msg: str) -> None:
    """A line in the launcher log (the supervisor's stdout)."""
    print(f"[higgsfield] {msg}", flush=True)


def supervise(state_dir: Path, project: str, run: str) -> int:
    """Body of the supervisor process: queue, run torchrun to the end, record how it ended."""
    secrets = json.loads(sys.stdin.read() or "{}")
    rd = RunDir(state_dir, project, run)
    spec = rd.spec()
    if rd.kill_marker.exists():
        _finish(rd, KILLED)
        return 0
    cap = queue.capacity(int(spec.get("gpus") or 0))
    entry = queue.Entry(project=project, run=run, want=queue.wanted(int(spec["nproc"]), bool(spec.get("exclusive")),
                                                                    cap),
                        exclusive=bool(spec.get("exclusive")), order=float(spec.get("submitted_at") or time.time()),
                        pid=os.getpid(), pid_start=pids.start_time(os.getpid()))

    def on_wait(others: list[queue.Entry]) -> None:
        rec = rd.read()
        rec.state = QUEUED
        rd.write(rec)
        holders = ", ".join(f"{e.run} ({len(e.slots or [])})" for e in others if e.slots is not None)
        _say(f"queued: wants {entry.want} of {cap.slots} {'GPU' if cap.gpus else 'CPU'} slot(s); "
             f"held by: {holders or '-'}")

    stopping = {"flag": False}

    def stop_waiting(signum: int, _frame: Any) -> None:
        stopping["flag"] = True

    signal.signal(signal.SIGTERM, stop_waiting)
    slots = queue.acquire(state_dir, entry, cap, should_stop=lambda: stopping["flag"] or rd.kill_marker.exists(),
                          on_wait=on_wait)
    if slots is None:
        _finish(rd, KILLED)
        return 0
    try:
        if cap.gpus:
            spec["gpu_ids"] = slots
            spec["cuda_visible_devices"] = ",".join(map(str, slots))
        record = rd.read()
        record.slots = slots
        if spec["runtime"] == "docker":
            rc = _supervise_container(spec, rd, record, secrets, stopping=lambda: stopping["flag"])
        else:
            rc = _supervise_process(spec, rd, record, secrets, stopping=lambda: stopping["flag"])
    finally:
        queue.release(state_dir, project, run)
    _finish(rd, None, rc)
    return 0


def _record_pid(record: RunRecord, role: str, pid: int) -> None:
    record.pids[role] = pid
    start = pids.start_time(pid)
    if start is not None:
        record.pid_starts[role] = start


def _supervise_process(spec: dict[str, Any], rd: RunDir, record: RunRecord, secrets: dict[str, str], *,
                       stopping: Any = lambda: False) -> int:
    argv = torchrun_argv(spec, rd, spec.get("python") or sys.executable)
    record.command = argv
    if rd.kill_marker.exists() or stopping():
        return 143
    launched: dict[str, int] = {}
    asked = {"stop": False}

    def forward(signum: int, _frame: Any) -> None:
        asked["stop"] = True
        if "pid" in launched:
            _signal_group(launched["pid"], signal.SIGTERM)

    # The handler is in place before torchrun exists: a kill's SIGTERM that lands while it
    # starts is remembered (and forwarded right after), never swallowed by the queue's handler.
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    proc = subprocess.Popen(argv, cwd=spec.get("code_dir") or None,  # noqa: S603
                            env=run_env(spec, rd, secrets), start_new_session=True)
    del secrets
    launched["pid"] = proc.pid
    _record_pid(record, "launcher", proc.pid)
    record.state, record.started_at = RUNNING, time.time()
    rd.write(record)
    # A kill that came between the check above and the pid being recorded found no launcher
    # to signal: look again now that the record names it.
    if asked["stop"] or rd.kill_marker.exists():
        _signal_group(proc.pid, signal.SIGTERM)
    rc = proc.wait()
    _kill_workers(rd, signal.SIGKILL)
    _signal_group(proc.pid, signal.SIGKILL)
    return rc


def _supervise_container(spec: dict[str, Any], rd: RunDir, record: RunRecord, secrets: dict[str, str], *,
                         stopping: Any = lambda: False) -> int:
    from higgsfield.invoker import containers

    argv = torchrun_argv(spec, rd, "python")
    record.command = argv
    if rd.kill_marker.exists() or stopping():
        return 143

    def started(container: Any) -> None:
        rec = rd.read()
        rec.command, rec.slots, rec.container = argv, record.slots, spec["container"]
        rec.state, rec.started_at = RUNNING, time.time()
        rd.write(rec)

    try:
        return containers.run_container(spec, rd, argv, container_env(spec, rd), on_started=started,
                                        secrets=secrets,
                                        should_stop=lambda: stopping() or rd.kill_marker.exists())
    except RunError as e:  # the container could not be created, or the engine went away mid-run
        _say(str(e))
        if not rd.kill_marker.exists():
            rec = rd.read()
            rec.reason = str(e)
            rd.write(rec)
        return 1


def _finish(rd: RunDir, state: str | None, rc: int | None = None) -> RunRecord:
    """Write the final record: killed, failed (first failing rank, or the lost peer node) or succeeded."""
    rd.legacy_secrets_path.unlink(missing_ok=True)  # left by an older invoker's docker runtime
    record = rd.read()
    record.ended_at = time.time()
    if rc is not None:
        record.exit_code = rc
    lost = _peer_lost(rd)
    if lost:
        record.state, record.failed_node = FAILED, lost.get("node")
        record.reason = lost.get("reason") or f"node {lost.get('node')} was lost"
    elif state is not None:
        record.state = state
    elif rd.kill_marker.exists():
        record.state = KILLED
    elif rc == 0:
        record.state = SUCCEEDED
    else:
        record.state = FAILED
        record.reason = record.reason or f"torchrun exited {rc}"
    if record.state == FAILED and record.failed_rank is None:
        failure = first_failure(rd)
        if failure:
            record.failed_rank, record.failed_at = failure
    rd.write(record)
    return record


def _peer_lost(rd: RunDir) -> dict[str, Any] | None:
    try:
        return dict(json.loads(rd.peer_lost_path.read_text()))
    except (OSError, ValueError):
        return None


# -- kill ---------------------------------------------------------------------

def kill(state_dir: Path, project: str, run: str, grace: float = STOP_GRACE_S, *,
         failed_node: str | None = None, reason: str | None = None) -> RunRecord:
    """Stop the run: SIGTERM (``docker stop``), then SIGKILL after ``grace`` seconds; returns the final record.

    ``failed_node``: the control side lost that node of the run; the run here ends
    ``failed`` naming it (also when it had already ended on its own).
    """
    rd = RunDir(state_dir, project, run)
    if not rd.exists():
        raise RunError(f"no run '{run}' of project '{project}'")
    if failed_node:
        write_json(rd.peer_lost_path, {"node": failed_node, "reason": reason or f"node {failed_node} was lost",
                                       "time": time.time()})
    record = rd.read()
    if record.terminal:
        if failed_node and record.state != SUCCEEDED:
            return _finish(rd, FAILED)
        return record
    rd.kill_marker.touch()
    if record.runtime == "docker":
        _stop_container(rd, record, grace)
    _signal_recorded(record, "launcher", signal.SIGTERM, group=True)
    _kill_workers(rd, signal.SIGTERM)
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
    _kill_workers(rd, signal.SIGKILL)
    if record.runtime == "docker":
        _stop_container(rd, record, 0)
    deadline = time.time() + 2.0
    while time.time() < deadline and not rd.read().terminal:
        time.sleep(0.1)
    if not rd.read().terminal:  # the supervisor is gone: finish the record ourselves
        _finish(rd, KILLED)
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
                _kill_workers(rd, signal.SIGKILL)
                record.reason = record.reason or "the supervisor process disappeared"
                rd.write(record)
                record = _finish(rd, KILLED if rd.kill_marker.exists() else FAILED)
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
        _signal_group(pid, sig)
    else:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


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

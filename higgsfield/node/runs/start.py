"""A run's start on one node (``higgsfield invoker start``): check, pin and record it, then start its supervisor.

:func:`start_run` checks what it can at once (an active run of the same name, the
deployed code, the image, GPUs), pins the spec and places it on this node
(:mod:`higgsfield.node.state.placement`), writes ``spec.json`` and the record, then
starts a detached *supervisor* (``higgsfield invoker supervise``,
:mod:`higgsfield.node.runs.supervisor`) that owns the run from then on; a kill is
:mod:`higgsfield.node.runs.stop`. On node 0 it first binds the port of the run's
coordinator (:mod:`higgsfield.node.gang.coordinator`) and hands the listening socket
to the supervisor, so the port it returns to the control side is already taken
when the other nodes are started with it.

Secrets and the run's coordinator token reach the supervisor on its stdin and live
only in memory and the run's environment, never in a file on the node: the process
runtime passes secrets in torchrun's environment; the Docker runtime writes them to
the container's stdin, where its launcher (:mod:`higgsfield.node.runtime.launch`) puts
them in the environment and becomes torchrun, so they never show in ``docker
inspect`` either.

The supervisor's pid is recorded with its start time (:mod:`higgsfield.node.state.pids`).
Two starts of one run name are serialised by a per-run ``flock``, so only one of them
can pass the "already active" check; the other is refused with
:class:`~higgsfield.contract.errors.RunNameInUse` and changes nothing. The record carries the
start's ``attempt`` token, so a failed start's clean-up
(:func:`higgsfield.node.runs.stop.kill_attempt`) stops only what that start made. The runtime is chosen per node: ``runtime:
docker``, ``process``, or ``auto`` (Docker when the engine answers and the project
has an image on this node, else processes). Everything a start writes is private to
the node user (umask 0077; the run's directories 0700).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from higgsfield.contract import layout
from higgsfield.contract.codec import decode, encode
from higgsfield.contract.errors import RunError, RunNameInUse
from higgsfield.contract.replies import StartReply
from higgsfield.contract.runspec import Handoff, RunSpec, StartRequest
from higgsfield.contract.states import ACTIVE, STARTING
from higgsfield.node.gang import queue
from higgsfield.node.runs.stop import refresh
from higgsfield.node.runtime.gpus import Nvml
from higgsfield.node.state import pids
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.locks import exclusive
from higgsfield.node.state.placement import NodeRun, Placement
from higgsfield.node.state.records import Attempt, RunDir, RunRecord


def detect_gpus() -> int:
    """Number of GPUs NVML counts, else ``nvidia-smi -L`` lists (0 without a driver)."""
    nvml = Nvml.open()
    if nvml is not None:
        try:
            return nvml.count()
        except nvml.lib.NVMLError:
            pass
        finally:
            nvml.close()
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False)  # noqa: S603
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def resolve_nproc(nproc: int | None, gpus: int) -> int:
    """Processes for this node: None (``auto``) is one per GPU (one without GPUs)."""
    return max(1, gpus) if nproc is None else nproc


def _home_path(p: str | os.PathLike[str]) -> Path:
    path = Path(p).expanduser()
    return path if path.is_absolute() else Path.home() / path


def choose_runtime(home: NodeState, spec: RunSpec) -> tuple[str, str | None]:
    """("docker", image) or ("process", None) for this node, per ``spec.runtime``."""
    from higgsfield.node.code import deploy
    from higgsfield.node.runtime import containers

    if spec.runtime == "process":
        return "process", None
    image = deploy.current_image(home, spec.project)
    if spec.runtime == "docker":
        if not containers.available():
            raise RunError("runtime 'docker' but no Docker engine answers on this node "
                           "(is the user in the docker group? run 'higgsfield setup')")
        if image is None or not containers.image_exists(image):
            raise RunError(f"no image of project '{spec.project}' on this node: run 'higgsfield deploy'")
        return "docker", image
    if image and containers.available() and containers.image_exists(image):
        return "docker", image
    return "process", None


def start_run(home: NodeState, request: StartRequest) -> StartReply:
    """Check, record the run and start its supervisor; returns the reply: its record (state ``starting``).

    The request's ``token`` authenticates the run's nodes to its coordinator (node 0's
    record carries the coordinator's port in ``coord_port``). Two starts of the same run
    name at once are serialised (a per-run lock): the second finds the first's record
    and is refused with :class:`RunNameInUse`, before it writes anything.
    """
    spec = request.spec
    os.umask(0o077)
    home.make()
    rd = RunDir(home, spec.project, spec.run)
    rd.make()
    with exclusive(rd.lock_file):  # held while this start checks and records the run
        before: list[Attempt] = []
        if rd.exists():
            old = refresh(rd)
            if old.state in ACTIVE:
                raise RunNameInUse(spec.run, old.state, spec.node)
            before = old.attempts
        run = place(home, spec)
        _clear_previous(rd)
        record = _start_supervisor(rd, run, request.handoff, [*before, _attempt(rd, spec, len(before))])
    return decode(StartReply, encode(record))   # the record as the control side reads it (a NodeRunView)


def place(home: NodeState, spec: RunSpec) -> NodeRun:
    """Pin ``spec`` on this node (code, nproc, runtime) and decide its placement; RunError if it cannot run here."""
    code_dir = _home_path(spec.code_dir or ".")
    if not code_dir.is_dir():
        raise RunError(f"project '{spec.project}' is not deployed on this node ({code_dir} is missing): "
                       "run 'higgsfield deploy'")
    check_mirror(spec.checkpoint_mirror)
    runtime, image = choose_runtime(home, spec)
    python = None
    if runtime == "process":  # torchrun in the project environment that deploy built (never the invoker's venv)
        from higgsfield.node.code.environment import python_for_run

        python = python_for_run(home, spec.project, code_dir)
    gpus = detect_gpus()
    nproc = resolve_nproc(spec.nproc, gpus)
    cap = queue.capacity(gpus)
    if cap.gpus and nproc > cap.slots:
        raise RunError(f"nproc_per_node {nproc} > {cap.slots} GPU(s) on this node")
    from higgsfield.node.runtime.containers import container_name

    ckpt = layout.checkpoint_dir(spec.project, spec.experiment, spec.run)   # under the project's cache dir
    pinned = spec.replace(code_dir=str(code_dir.resolve()),  # a later deploy does not change a running run
                          nproc=nproc, runtime=runtime)
    return NodeRun(pinned, Placement(
        gpus=gpus, cache_dir=str(layout.cache_dir(spec.project)), checkpoint_dir=str(ckpt),
        container=container_name(spec.project, spec.experiment, spec.run, spec.node), image=image, python=python))


def check_mirror(url: str) -> None:
    """A path mirror must be a directory this node's user can write, or the run is refused here.

    Found at the first save instead, it would cost the run's progress (every upload failing in the
    background); in a container the path is a bind mount of this very directory
    (:mod:`higgsfield.node.runtime.containers`), so the check holds for both runtimes. The directory is
    made when it is missing, as the mirror itself would; a file is written and removed to prove it
    (``os.access`` says nothing true about NFS or root-squashed mounts).
    """
    path = layout.mirror_path(url)
    if path is None:
        return
    import tempfile

    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".higgsfield-probe-"):
            pass
    except OSError as e:
        import getpass

        raise RunError(f"checkpoint.mirror {path} cannot be written by user {getpass.getuser()} on this node "
                       f"({e.strerror or e}): mount it there writable, or change checkpoint.mirror in "
                       "higgsfield.yml") from None


def _clear_previous(rd: RunDir) -> None:
    """A re-used run name starts afresh (its checkpoints stay): old logs' markers and the kill marker go."""
    for p in (rd.kill_marker, rd.legacy_secrets_path):
        p.unlink(missing_ok=True)
    if rd.logs.is_dir():
        for p in rd.logs.glob("rank*.*"):
            if p.suffix in (".pid", ".json", ".done"):
                p.unlink(missing_ok=True)
    rd.make()


def _attempt(rd: RunDir, spec: RunSpec, earlier: int) -> Attempt:
    """This start as the record keeps it: where each log file ends now is where its output will begin
    (``run`` streams from there; ``logs`` shows every attempt under its header)."""
    sizes = rd.log_sizes()
    return Attempt(number=earlier + 1, at=time.time(), nodes=list(spec.nodes),
                   why="first start" if not earlier and not sizes else "the name re-used", logs=sizes)


def _start_supervisor(rd: RunDir, run: NodeRun, handoff: Handoff, attempts: list[Attempt]) -> RunRecord:
    """Write spec.json and the record, start ``invoker supervise`` detached, hand it the secrets on stdin."""
    spec = run.spec
    listener = None
    if spec.node_rank == 0:  # node 0 hosts the run's coordinator: its port is taken from now on
        from dataclasses import replace

        from higgsfield.node.gang.listener import listen

        listener = listen(queue.reserved_ports(rd.home))
        run = NodeRun(spec, replace(run.placement, coord_port=listener.getsockname()[1]))
    run.write(rd.spec_path)
    record = RunRecord(project=spec.project, experiment=spec.experiment, run=spec.run, node=spec.node,
                       node_rank=spec.node_rank, nnodes=spec.nnodes, nproc=run.nproc, state=STARTING,
                       runtime=spec.runtime, image=run.placement.image, exclusive=spec.exclusive,
                       coord_port=run.placement.coord_port, container=run.placement.container if run.docker else None,
                       attempt=spec.attempt or None, attempts=attempts, spare=spec.spare)
    argv = [sys.executable, "-m", "higgsfield", "invoker", "--state-dir", str(rd.home.root), "supervise",
            spec.project, spec.run]
    if listener is not None:
        argv += ["--listen-fd", str(listener.fileno())]
    launcher_log = open(rd.launcher_log, "ab")  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen(  # noqa: S603 - argv list, no shell
            argv, stdin=subprocess.PIPE, stdout=launcher_log, stderr=subprocess.STDOUT,
            cwd=spec.code_dir, start_new_session=True,
            pass_fds=(listener.fileno(),) if listener is not None else ())
    finally:
        launcher_log.close()
        if listener is not None:
            listener.close()  # the supervisor has its own copy
    pids.remember(record, "supervisor", proc.pid)
    rd.write(record)
    # The supervisor blocks on stdin until this write is done, so the record above is never raced.
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(encode(handoff)).encode())
    proc.stdin.close()
    return record

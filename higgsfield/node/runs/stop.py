"""Stopping a run on one node (``higgsfield invoker kill``), and the leftovers of one whose supervisor died.

:func:`kill` marks the run (the ``kill`` file its supervisor watches), then stops
what runs: ``docker stop`` for its containers, SIGTERM to torchrun and every worker
(each in a session of its own) and whatever they started, ``grace`` seconds, then
SIGKILL (:func:`higgsfield.node.state.pids.end`). The supervisor writes the final
record; if it does not within a moment, it is killed too and the record is written
here, so nothing outlives a kill. A queued or starting supervisor is asked to stop
at once (SIGTERM): it has nothing running yet.

:func:`kill_attempt` is the clean-up of a start that failed elsewhere: it stops the
run only if this node's record was made by that start (its ``attempt``), so a run of
the same name that another start holds is never touched.

:func:`refresh` is how every reader of a record sees it: a run whose supervisor
disappeared without writing its end (a reboot, an OOM kill of the supervisor) is
stopped the same way (its container, its workers) and marked failed (or killed, if
a kill had been asked).

The run's processes are found by identity, never by name
(:mod:`higgsfield.node.state.pids`): torchrun and the supervisor by recorded pid and
start time, the workers by their pid files and the run directory in their
environment; a pid that now names another process is never signalled.
"""

from __future__ import annotations

import contextlib
import signal
import time

import psutil

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.errors import RunError
from higgsfield.contract.noderuns import NodeRunView
from higgsfield.contract.replies import KillReply, KillTargetReply
from higgsfield.contract.states import ACTIVE, FAILED, KILLED, QUEUED, STARTING
from higgsfield.node.gang import queue
from higgsfield.node.runtime.torchrun import workers
from higgsfield.node.state import pids
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.locks import exclusive
from higgsfield.node.state.placement import STOP_GRACE_S
from higgsfield.node.state.records import RunDir, RunRecord, finish, list_runs

RECORD_WAIT_S = 2.0   # after the run's processes ended: how long its supervisor gets to write the end
ORPHAN_AGE_S = 5.0    # a record younger than this may not have its supervisor's pid yet


def kill_attempt(home: NodeState, project: str, run: str, attempt: str,
                 grace: float = STOP_GRACE_S) -> RunRecord | None:
    """Stop ``run`` only if start ``attempt`` made its record here; None if that start left nothing here.

    The check and the kill marker are done under the run's start lock: no other start
    can take the name in between, and this attempt's own start, if still under way
    here, is waited for and then stopped.
    """
    rd = RunDir(home, project, run)
    if not rd.path.is_dir():
        return None
    with exclusive(rd.lock_file):
        record = _readable(rd)
        if record is None or record.attempt != attempt:  # none, or not provably this start's
            return None
        if record.terminal:
            return record
        rd.kill_marker.touch()
    return kill(home, project, run, grace, attempt=attempt)


def kill(home: NodeState, project: str, run: str, grace: float = STOP_GRACE_S,
         attempt: str | None = None) -> RunRecord:
    """Stop the run: SIGTERM (``docker stop``), then SIGKILL after ``grace`` seconds; returns the final record.

    The run's supervisor tells the run's coordinator, which stops the run on its other
    nodes too (as killed), should this kill not reach them. With ``attempt``, a record
    that another start made in the meantime is left alone.
    """
    rd = RunDir(home, project, run)
    if not rd.exists():
        raise RunError(f"no run '{run}' of project '{project}'")
    record = rd.read()
    if record.terminal:
        return record
    rd.kill_marker.touch()
    if record.runtime == "docker":
        _stop_containers(rd, record, grace)
    supervisor = pids.recorded(record, "supervisor")
    if record.state in (QUEUED, STARTING) and supervisor is not None:
        pids.send([supervisor], signal.SIGTERM)  # a queued supervisor stops waiting at once
    deadline = time.monotonic() + grace
    left = pids.end(_processes(rd, record), grace)
    if _ended(rd, max(deadline - time.monotonic(), 0.0 if left else RECORD_WAIT_S)):
        return refresh(rd)
    # The supervisor did not write the end in time: nothing of the run is left running, it included.
    record = rd.read()
    if attempt is not None and record.attempt != attempt:
        return record  # ended, and another start took the name since: not ours to stop
    supervisor = pids.recorded(record, "supervisor")
    pids.kill([*_processes(rd, record), *([supervisor] if supervisor is not None else [])])
    if record.runtime == "docker":
        _stop_containers(rd, record, 0)
    if not _ended(rd, RECORD_WAIT_S):  # the supervisor is gone: finish the record here
        finish(rd, KILLED)
    queue.release(home, project, run)
    return rd.read()


def kill_target(home: NodeState, project: str, target: str, grace: float = STOP_GRACE_S) -> KillTargetReply:
    """Kill the active runs ``target`` names on this node (a run name, else an experiment), all at once.

    Returns how many runs it matched and their final records: one call per node is all a
    kill costs the control side.
    """
    from concurrent.futures import ThreadPoolExecutor

    rds = list_runs(home, project)
    chosen = [rd for rd in rds if rd.path.name == target]
    if not chosen:
        chosen = [rd for rd in rds if _experiment_of(rd) == target]
    active = [rd for rd in chosen if refresh(rd).state in ACTIVE]
    if not active:
        return KillTargetReply(matched=len(chosen))
    with ThreadPoolExecutor(max_workers=len(active)) as pool:
        records = list(pool.map(lambda rd: kill(home, project, rd.path.name, grace), active))
    return KillTargetReply(matched=len(chosen), killed=[decode(NodeRunView, encode(r)) for r in records])


def kill_run(home: NodeState, project: str, run: str, *, grace: float = STOP_GRACE_S, missing_ok: bool = False,
             attempt: str | None = None) -> KillReply:
    """``invoker kill --run``: stop ``run`` and return its final record; ``missing`` where there is no such
    run and ``missing_ok``, or (``attempt``) where that start made no record here (:func:`kill_attempt`)."""
    if attempt is not None:
        record = kill_attempt(home, project, run, attempt, grace=grace)
    elif missing_ok and not RunDir(home, project, run).exists():
        record = None
    else:
        record = kill(home, project, run, grace=grace)
    return KillReply(run=run, missing=True) if record is None else decode(KillReply, encode(record))


def refresh(rd: RunDir) -> RunRecord:
    """The record, marked failed if its supervisor died without saying so (e.g. a reboot).

    Whatever the dead supervisor left (a container, workers) is stopped, so a crash
    leaves no orphans.
    """
    record = rd.read()
    if record.state not in ACTIVE or not record.pids.get("supervisor"):
        return record
    if pids.recorded(record, "supervisor") is not None or time.time() - record.created_at <= ORPHAN_AGE_S:
        return record
    record = rd.read()
    if record.terminal:
        return record
    if record.runtime == "docker":
        _stop_containers(rd, record, 1)
    pids.kill(_processes(rd, record))
    record.reason = record.reason or "the supervisor process disappeared"
    rd.write(record)
    return finish(rd, KILLED if rd.kill_marker.exists() else FAILED)


def _processes(rd: RunDir, record: RunRecord) -> list[psutil.Process]:
    """What of the run runs on this node now: torchrun (the ``launcher``) and its workers."""
    torchrun = pids.recorded(record, "launcher")
    return [*([torchrun] if torchrun is not None else []), *workers(rd)]


def _ended(rd: RunDir, timeout: float) -> bool:
    """Whether the record is final within ``timeout`` seconds (its supervisor writes it)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError):
            if rd.read().terminal:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _readable(rd: RunDir) -> RunRecord | None:
    """The record, or None if there is none or it does not decode."""
    if not rd.exists():
        return None
    try:
        return rd.read()
    except (OSError, ValueError, TypeError, RunError):
        return None


def _experiment_of(rd: RunDir) -> str | None:
    try:
        return rd.read().experiment
    except (OSError, ValueError):
        return None


def _stop_containers(rd: RunDir, record: RunRecord, grace: float) -> None:
    from higgsfield.node.runtime import containers

    with contextlib.suppress(Exception):
        containers.stop_run_containers(rd, record.container, grace=grace)

"""Process identity and ending on a node, through psutil: a recorded pid is never mistaken for another process.

Records and queue entries keep each pid with its start time in clock ticks since
boot (the unit of ``/proc/PID/stat``, which records have always used): after a
reboot, or simply much later, the same number may belong to an unrelated process,
and :func:`find` then returns None, :func:`alive` False, and nothing is signalled.
The start time is taken from psutil's ``create_time()`` relative to the boot time,
so a clock step between the record and the check changes nothing.

:func:`end` is how anything of a run stops: SIGTERM, ``grace`` seconds
(``psutil.wait_procs``), then SIGKILL to what is left, including what those
processes started meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from higgsfield.node.state.records import RunRecord

_TICKS = os.sysconf("SC_CLK_TCK")
_REAP_S = 2.0  # after SIGKILL: how long to wait for the kernel to take them away


def _started(p: psutil.Process) -> int:
    return round((p.create_time() - psutil.boot_time()) * _TICKS)


def start_time(pid: int) -> int | None:
    """``pid``'s start time (clock ticks since boot), None if there is no such process."""
    try:
        return _started(psutil.Process(pid))
    except (psutil.Error, OSError):
        return None


def find(pid: int | None, start: int | None = None) -> psutil.Process | None:
    """The live process ``pid`` if it is the one recorded with ``start`` (when given); None if gone or reused."""
    if not pid:
        return None
    try:
        p = psutil.Process(pid)
    except (psutil.Error, OSError):
        return None
    try:
        if p.status() == psutil.STATUS_ZOMBIE or (start is not None and _started(p) != start):
            return None
    except psutil.AccessDenied:  # not ours to inspect: it exists, but is not provably the recorded one
        return None if start is not None else p
    except (psutil.Error, OSError):
        return None
    return p


def alive(pid: int, start: int | None = None) -> bool:
    """``pid`` is running (not a zombie) and is the process recorded with ``start`` (when given)."""
    return find(pid, start) is not None


def remember(record: RunRecord, role: str, pid: int) -> None:
    """Record ``pid`` as the run's ``role`` (``supervisor``, ``launcher``) with its start time."""
    record.pids[role] = pid
    start = start_time(pid)
    if start is not None:
        record.pid_starts[role] = start


def recorded(record: RunRecord, role: str) -> psutil.Process | None:
    """The run's live ``role`` process, if its recorded pid still names it."""
    return find(record.pids.get(role), record.pid_starts.get(role))


def with_descendants(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    """``procs`` and every process they started (recursively), each once."""
    out: dict[int, psutil.Process] = {}
    for p in procs:
        out.setdefault(p.pid, p)
        with contextlib.suppress(psutil.Error, OSError):
            for c in p.children(recursive=True):
                out.setdefault(c.pid, c)
    return list(out.values())


def send(procs: Iterable[psutil.Process], sig: int) -> None:
    """Signal each of ``procs`` that is still the process it was (psutil checks its identity)."""
    for p in procs:
        with contextlib.suppress(psutil.Error, OSError):
            p.send_signal(sig)


def kill(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    """SIGKILL ``procs`` and their descendants; wait briefly for them to go. Returns those still there."""
    every = with_descendants(procs)
    send(every, signal.SIGKILL)
    return psutil.wait_procs(every, timeout=_REAP_S)[1]


def end(procs: Iterable[psutil.Process], grace: float) -> list[psutil.Process]:
    """SIGTERM ``procs`` (and their descendants), wait ``grace`` seconds, SIGKILL what is left.

    Returns the processes still there after all that (none, unless the kernel is slow).
    """
    every = with_descendants(procs)
    send(every, signal.SIGTERM)
    _, left = psutil.wait_procs(every, timeout=max(grace, 0.0))
    return kill(left) if left else []

"""Process identity on a node: a pid plus its start time, so a reused pid is never mistaken for ours.

Records keep each pid with its start time (``/proc/PID/stat`` field 22, clock ticks
since boot). After a reboot, or simply much later, the same number may belong to an
unrelated process: :func:`alive` then says no, :func:`reused` yes, and nothing is
signalled.
"""

from __future__ import annotations

import os


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (field 3 onwards), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()
    except (OSError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), None if there is no such process (or no /proc)."""
    fields = _stat_fields(pid)
    if not fields or len(fields) < 20:
        return None
    try:
        return int(fields[19])  # field 22 overall: fields start at 3 after the ")"
    except ValueError:
        return None


def alive(pid: int, start: int | None = None) -> bool:
    """``pid`` is running (not a zombie) and is the process recorded with ``start`` (when given)."""
    if not _exists(pid):
        return False
    fields = _stat_fields(pid)
    if fields is None:
        return True  # no /proc to tell: it exists
    if fields[0] in ("Z", "X"):
        return False
    return start is None or start_time(pid) == start


def reused(pid: int, start: int | None) -> bool:
    """True when ``pid`` now belongs to a different process than the one recorded (never signal it)."""
    if start is None:
        return False
    now = start_time(pid)
    return now is not None and now != start


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

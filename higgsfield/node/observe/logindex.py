"""The time index of a rank's log: ``rank<N>.idx`` beside ``rank<N>.log``, written by the tee, read by ``logs --since``.

One line per entry, ``OFFSET UNIXTIME``: the byte offset in the log of the first
line that arrived at that time. Entries are at least ``INDEX_EVERY`` seconds apart,
so every line between two entries started arriving less than ``INDEX_EVERY``
seconds after the first of them; a reader starting from an entry shows at most
that much of earlier lines and never misses a later one. A torn last entry (the
writer died mid-line) is skipped.

The writer (the worker's tee, :mod:`higgsfield.node.entrypoint`) holds a shared
``flock`` on the index while it runs (:func:`hold`), so a reader can tell that a
log is drained (:func:`held`). Stdlib only: the tee runs in the worker, before any
user code.
"""

from __future__ import annotations

import fcntl
from pathlib import Path

INDEX_EVERY = 1.0  # seconds between two entries of rank<N>.idx, at least


def index_of(log: Path) -> Path:
    """``rank<N>.idx`` of ``rank<N>.log``."""
    return log.with_suffix(".idx")


class IndexWriter:
    """Decides the index entries of a log as chunks are appended to it (the tee's half of the format)."""

    def __init__(self, at_line_start: bool) -> None:
        self.at_line_start = at_line_start  # the log ends with a newline (or is empty)
        self.last = float("-inf")

    def entry(self, start: int, chunk: bytes, now: float) -> bytes | None:
        """The index line for ``chunk``, appended at offset ``start`` at time ``now``; None if none is due.

        Call :meth:`wrote` once the line is in the index (a failed write tries again with the next chunk).
        """
        due = now - self.last >= INDEX_EVERY
        entry = -1
        if due:
            if self.at_line_start:
                entry = start
            else:
                nl = chunk.find(b"\n")
                entry = start + nl + 1 if 0 <= nl < len(chunk) - 1 else -1  # else: the next chunk's start
        self.at_line_start = chunk.endswith(b"\n")
        return f"{entry} {now:.3f}\n".encode() if entry >= 0 else None

    def wrote(self, now: float) -> None:
        self.last = now


def hold(ifd: int) -> None:
    """Mark the index as being written (a shared ``flock`` until the writer exits)."""
    fcntl.flock(ifd, fcntl.LOCK_SH)


def held(index: Path) -> bool:
    """True while a writer holds ``index``: its log may still grow."""
    try:
        with open(index, "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
    except OSError:
        pass
    return False


def start_offset(log: Path, since: float) -> int:
    """Where to start reading ``log`` to show its lines written at or after ``since`` (a UNIX time).

    A log without an index is shown whole if it was modified at or after ``since``,
    else from its end.
    """
    try:
        st = log.stat()
    except OSError:
        return 0
    previous = None
    try:
        with open(index_of(log), "rb") as f:
            for raw in f:
                fields = raw.split()
                if len(fields) != 2:
                    continue  # a torn last entry
                try:
                    offset, when = int(fields[0]), float(fields[1])
                except ValueError:
                    continue
                # lines from ``offset`` up to the next entry started before when + INDEX_EVERY
                if when > since - INDEX_EVERY:
                    return min(offset, st.st_size)
                previous = offset
    except OSError:
        pass
    if st.st_mtime < since:
        return st.st_size
    return min(previous or 0, st.st_size)  # the end of a line begun earlier, or no index at all

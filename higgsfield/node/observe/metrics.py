"""Read a run's step metrics (``RUN_DIR/metrics.jsonl``, written by rank 0), once or as the run trains.

The file is JSON lines of :class:`~higgsfield.metrics.StepMetrics` on node 0 of the run
(rank 0 lives there); on the other nodes there is none, and reading it yields nothing.
Each line is decoded here, once (:func:`~higgsfield.metrics.decode_line`): a good line
is a StepMetrics, a line of the wrong shape (not JSON, wrong kinds, over
``MAX_LINE_BYTES``: never held in memory whole) is skipped and counted, and the new
total is yielded as a :class:`~higgsfield.metrics.Skipped`. A torn last line waits for
its newline, so a reader never chokes on a worker killed mid-write.

The file is opened without following a symlink and only if it is a regular file (a
FIFO would block the reader forever): a run directory's contents are not trusted.

Use (``higgsfield invoker metrics``)::

    for item in read_metrics(rd, follow=True, is_done=lambda: refresh(rd).terminal):
        ...        # StepMetrics; Skipped(total); None: nothing new for ``heartbeat`` seconds
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from higgsfield.metrics import MAX_LINE_BYTES, METRICS_FILE, MetricsItem, Skipped, decode_line
from higgsfield.node.state.records import RunDir

POLL_S = 0.2      # how often a follower looks for new lines
READ_CHUNK = 1 << 20


def metrics_path(rd: RunDir) -> Path:
    return rd.path / METRICS_FILE


class LineReader:
    """The complete lines appended to a file since the last read, each at most ``limit`` bytes.

    A longer line is not kept: its bytes are dropped as they come and it is reported
    once, as ``None``, when its newline arrives, so memory stays bounded whatever a
    writer wrote.
    """

    def __init__(self, path: Path, limit: int = MAX_LINE_BYTES) -> None:
        self.path = path
        self.limit = limit
        self.offset = 0
        self.pending = bytearray()
        self.over = False          # inside a line already past the limit

    def read(self) -> Iterator[bytes | None]:
        """The lines (``None``: one too long) that are complete now; nothing if the file is not there."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:            # absent, a symlink (ELOOP), unreadable: no metrics here
            return
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return
            f.seek(self.offset)
            while chunk := f.read(READ_CHUNK):
                self.offset += len(chunk)
                yield from self._feed(chunk)

    def _feed(self, chunk: bytes) -> Iterator[bytes | None]:
        start = 0
        while (nl := chunk.find(b"\n", start)) >= 0:
            piece, start = chunk[start:nl], nl + 1
            if self.over or len(self.pending) + len(piece) > self.limit:
                self.over = False
                self.pending.clear()
                yield None
            else:
                line = bytes(self.pending + piece)
                self.pending.clear()
                yield line
        if not self.over:
            self.pending += chunk[start:]
            if len(self.pending) > self.limit:
                self.over = True
                self.pending.clear()


def read_metrics(rd: RunDir, *, follow: bool = False, is_done: Callable[[], bool] = lambda: True,
                 skip: int = 0, heartbeat: float | None = None) -> Iterator[MetricsItem]:
    """Every step of the run after the first ``skip``; with ``follow``, until the run is over.

    A :class:`Skipped` with the file's running total of bad lines follows each read that
    found new ones (``skip`` counts good lines only). Following ends once ``is_done()``
    and the file has nothing more (read once more after the run ended, so the last step
    is never lost). With ``heartbeat`` a ``None`` is yielded after that many quiet
    seconds, so a caller can tell a slow run from a lost one.
    """
    reader = LineReader(metrics_path(rd))
    seen = skipped = told = 0
    quiet_since = time.monotonic()
    while True:
        done = is_done() if follow else True   # asked before reading: lines written until then are read
        got = False
        for raw in reader.read():
            if raw is not None and not raw.strip():
                continue
            try:
                if raw is None:
                    raise ValueError("too long")
                m = decode_line(raw.decode(errors="replace"))
            except ValueError:
                skipped += 1
                continue
            seen += 1
            if seen > skip:
                got = True
                yield m
        if skipped != told:
            told = skipped
            got = True
            yield Skipped(skipped)
        if done:
            return
        now = time.monotonic()
        if got:
            quiet_since = now
        elif heartbeat is not None and now - quiet_since >= heartbeat:
            quiet_since = now
            yield None
        time.sleep(POLL_S)

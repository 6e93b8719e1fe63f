"""Read a run's step metrics (``RUN_DIR/metrics.jsonl``, written by rank 0), once or as the run trains.

The file is JSON lines of :class:`~higgsfield.metrics.StepMetrics` on node 0 of the run
(rank 0 lives there); on the other nodes there is none, and reading it yields nothing.
Lines are passed on as written (the reader parses them), a torn last line waits for its
newline, and a line that is not a JSON object is skipped, so a reader never chokes on a
worker killed mid-write.

Use (``higgsfield invoker metrics``)::

    for line in read_metrics(rd, follow=True, is_done=lambda: refresh(rd).terminal):
        print(line)        # None: nothing new for ``heartbeat`` seconds
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from higgsfield.invoker.records import RunDir
from higgsfield.metrics import METRICS_FILE

POLL_S = 0.2      # how often a follower looks for new lines
READ_CHUNK = 1 << 20


def metrics_path(rd: RunDir) -> Path:
    return rd.path / METRICS_FILE


def _complete(raw: str) -> bool:
    try:
        return isinstance(json.loads(raw), dict)
    except ValueError:
        return False


def read_metrics(rd: RunDir, *, follow: bool = False, is_done: Callable[[], bool] = lambda: True,
                 skip: int = 0, heartbeat: float | None = None) -> Iterator[str | None]:
    """Every metrics line of the run after the first ``skip``; with ``follow``, until the run is over.

    Following ends once ``is_done()`` and the file has nothing more (read once more after
    the run ended, so the last step is never lost). With ``heartbeat`` a ``None`` is
    yielded after that many quiet seconds, so a caller can tell a slow run from a lost one.
    """
    path = metrics_path(rd)
    offset = 0
    pending = b""
    seen = 0
    quiet_since = time.monotonic()
    while True:
        done = is_done() if follow else True   # asked before reading: lines written until then are read
        got = False
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                while chunk := f.read(READ_CHUNK):
                    offset += len(chunk)
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for raw in lines:
                        text = raw.decode(errors="replace").strip()
                        if not text or not _complete(text):
                            continue
                        seen += 1
                        if seen > skip:
                            got = True
                            yield text
        except FileNotFoundError:
            pass
        if done:
            return
        now = time.monotonic()
        if got:
            quiet_since = now
        elif heartbeat is not None and now - quiet_since >= heartbeat:
            quiet_since = now
            yield None
        time.sleep(POLL_S)

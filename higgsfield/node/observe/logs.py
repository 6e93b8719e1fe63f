"""Read a run's per-rank log files, once or following them until the run ends.

Each line is yielded as ``(rank, text)``; within a rank, lines keep their order
and none is lost (partial lines wait for their newline). Files are read at most
``READ_CHUNK`` bytes per pass, round-robin, so one huge log neither fills memory nor
starves the others. ``rank`` is -1 for the
launcher's own log (torchrun's messages: restarts, failures).

A line of any length is read: past ``MAX_LINE`` bytes (64 KiB) it is cut with a
marker (`` … [cut N bytes]``, :class:`~higgsfield.contract.text.LineSplitter`), and every
line after it comes as usual; the whole line stays in the log file. This is the
cap at the source: what ``invoker logs`` sends is bounded, so no reader at the other
end meets a line it cannot take. Invalid UTF-8 becomes U+FFFD; NUL and other
control bytes stay in the line (the laptop shows them inert).

``since`` (a UNIX time) starts each rank's log at its first line that may have
been written at or after it, found in ``rank<N>.idx`` (see
:mod:`higgsfield.node.observe.logindex`): it may show up to ``INDEX_EVERY`` (1 s) of earlier
lines, never misses a later one. A log without an index (the launcher's, or a
rank whose tee could not start) is shown whole if it was modified at or after
``since``, else only what is appended to it from now on (with ``follow``).

Following ends once the run is over and no tee still holds its index (every byte
of a dead worker's pipe is in the log), waiting at most ``DRAIN_WAIT`` seconds for
that.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Sequence
from itertools import pairwise
from pathlib import Path

from higgsfield.contract.layout import LAUNCHER_LOG
from higgsfield.contract.text import MAX_LINE, LineSplitter
from higgsfield.node.observe import logindex
from higgsfield.node.observe.logindex import start_offset
from higgsfield.node.state.records import Attempt, RunDir

_RANK_LOG = re.compile(r"^rank(\d+)\.log$")
LAUNCHER = -1
READ_CHUNK = 1 << 20  # at most this much of one file per pass: a multi-GB log never sits in memory
DRAIN_WAIT = 10.0  # seconds a finished run's tees get to write what is left in their pipes


def _log_files(rd: RunDir) -> dict[int, Path]:
    files: dict[int, Path] = {}
    if not rd.logs.is_dir():
        return files
    for p in rd.logs.iterdir():
        m = _RANK_LOG.match(p.name)
        if m:
            files[int(m.group(1))] = p
        elif p.name == LAUNCHER_LOG:
            files[LAUNCHER] = p
    return files


def _segment(files: dict[int, Path], ranks: set[int] | None, start: dict[str, int],
             end: dict[str, int]) -> Iterator[tuple[int, str]]:
    """The lines each log file got between two attempts' starts, file by file (an ended attempt)."""
    for rank, path in sorted(files.items()):
        if ranks is not None and rank not in ranks:
            continue
        a, b = start.get(path.name, 0), end.get(path.name, 0)
        if b <= a:
            continue
        split = LineSplitter(MAX_LINE)
        try:
            with open(path, "rb") as f:
                f.seek(a)
                while a < b and (chunk := f.read(min(READ_CHUNK, b - a))):
                    a += len(chunk)
                    for line in split.feed(chunk):
                        yield rank, line
        except OSError:
            continue
        for line in split.end():
            yield rank, line


def _teeing(rd: RunDir) -> bool:
    """True while some rank's tee still runs (holds its index): its log may still grow."""
    return rd.logs.is_dir() and any(logindex.held(p) for p in rd.logs.glob("rank*.idx"))


def read_lines(rd: RunDir, *, follow: bool = False, ranks: set[int] | None = None,
               is_done: Callable[[], bool] | None = None, poll: float = 0.2,
               heartbeat: float | None = None, since: float | None = None,
               attempts: Sequence[Attempt] = (), current: bool = False) -> Iterator[tuple[int | None, str]]:
    """Yield ``(rank, line)`` from every log; with ``follow``, until ``is_done()`` and drained.

    With ``heartbeat``, a ``(None, "")`` comes whenever that many seconds passed
    without a line, so a reader at the other end of a connection can tell a quiet
    run from a dead node. With ``since``, only lines written from then on (see above).
    ``attempts`` (the record's): each attempt's lines under its header, a launcher line (with
    ``current``, only the last attempt's lines, as ``run`` shows its own start).
    """
    offsets: dict[int, int] = {}
    if attempts and since is None:
        files = _log_files(rd)
        if not current:   # headers are launcher lines: a --rank filter leaves them out, as it does the launcher's
            for one, nxt in pairwise(attempts):
                if ranks is None:
                    yield LAUNCHER, one.header
                yield from _segment(files, ranks, one.logs, nxt.logs)
            if ranks is None:
                yield LAUNCHER, attempts[-1].header
        offsets = {rank: attempts[-1].logs.get(path.name, 0) for rank, path in files.items()}
    partial: dict[int, LineSplitter] = {}   # per rank: the line begun and not ended yet (at most MAX_LINE bytes)
    last = time.monotonic()
    done_at: float | None = None
    while True:
        done = bool(is_done and is_done()) if follow else True
        if done and follow:
            done_at = time.monotonic() if done_at is None else done_at
            if time.monotonic() - done_at < DRAIN_WAIT and _teeing(rd):
                done = False
        got = False
        for rank, path in sorted(_log_files(rd).items()):
            if ranks is not None and rank not in ranks:
                continue
            if rank not in offsets:
                offsets[rank] = 0 if since is None else start_offset(path, since)
            try:
                with open(path, "rb") as f:
                    f.seek(offsets.get(rank, 0))
                    chunk = f.read(READ_CHUNK)
            except OSError:
                continue
            if not chunk:
                continue
            got = True
            offsets[rank] = offsets.get(rank, 0) + len(chunk)
            for line in partial.setdefault(rank, LineSplitter(MAX_LINE)).feed(chunk):
                yield rank, line
            last = time.monotonic()
        if done and not got:
            for rank, rest in sorted(partial.items()):
                for line in rest.end():
                    yield rank, line
            return
        if not got:
            if heartbeat and time.monotonic() - last >= heartbeat:
                last = time.monotonic()
                yield None, ""
            time.sleep(poll)

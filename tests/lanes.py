"""Two test lanes on one machine, and the tests that need it to themselves.

``make test`` runs the suite as two pytest processes side by side (the Makefile's ``LANE_B``):
most tests keep about one of the machine's 2 cores busy, so two lanes nearly halve the wall time.
A few tests measure the machine itself: ``doctor --fabric`` compares the bandwidth of the test
bed's "nodes", which are users of this one machine, and a busy second lane makes a healthy
node look slow. Those tests are marked ``@pytest.mark.quiet``; while one runs, the other lane
waits between its tests.

The rule is a readers-writer lock on two files (``flock``): every test holds ``LANE`` shared
for its whole run; a quiet test holds it exclusively for its whole run. A quiet test first takes
``TURNSTILE`` exclusively, and every other test passes through ``TURNSTILE`` (shared, at once
released) before it takes ``LANE``, so the waiting quiet test is not starved by a lane whose
next test always starts before the kernel wakes the waiter. One lane, or a test run alone, never
waits: nobody else holds the lock.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DIR = Path(__file__).resolve().parents[1] / ".testbed"   # per checkout; git ignores it


@contextmanager
def _flock(path: Path, how: int) -> Iterator[None]:
    path.parent.mkdir(exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, how)
        yield
    finally:
        os.close(fd)   # closing the description drops its lock


@contextmanager
def shared(where: Path = DIR) -> Iterator[None]:
    """An ordinary test's whole run: beside the other lane's, never beside a quiet test."""
    with _flock(where / "lane.turnstile", fcntl.LOCK_SH):
        pass
    with _flock(where / "lane.lock", fcntl.LOCK_SH):
        yield


@contextmanager
def alone(where: Path = DIR) -> Iterator[None]:
    """A quiet test's whole run: the other lane's current test ends, and its next waits for this one."""
    with _flock(where / "lane.turnstile", fcntl.LOCK_EX), _flock(where / "lane.lock", fcntl.LOCK_EX):
        yield

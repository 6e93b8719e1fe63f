"""Two test lanes on one machine, and the tests that need it to themselves.

``make test`` runs the suite as two pytest processes side by side (the Makefile's ``BESIDE``):
one pytest kept 1.3 of the machine's 2 cores busy, and a second lane uses the rest (make test went
from 57 to 46 minutes; docs/benchmarks.md, "The developer loop").
A few tests measure the machine itself: ``doctor --fabric`` compares the bandwidth of the test
bed's "nodes", which are users of this one machine, and a busy second lane makes a healthy
node look slow. Those tests are marked ``@pytest.mark.quiet``; while one's body runs, the other
lane waits between its tests. Its fixtures (a deploy, say) are set up beside the other lane.

The rule is a readers-writer lock on a file (``flock``): every test holds ``lane.lock`` shared
for its whole run, and a quiet test's call turns its hold exclusive. A quiet test first takes
``lane.turnstile`` exclusively, and every test passes through the turnstile (shared, at once
released) before it takes ``lane.lock``, so a waiting quiet test is not starved by a lane whose
next test always starts before the kernel wakes the waiter. A quiet test lets go of its shared
hold before it queues at the turnstile, so two quiet tests, one in each lane, take turns instead
of waiting for each other. One lane, or a test run alone, never waits: nobody else holds the lock.

A quiet test waits for the other lane's current test, setup included, which can take minutes. So the
modules that hold one run last in their lane (:func:`quiet_last`): in the heavier lane, the other one is
then done or nearly. Each lane's report ends with what its quiet tests waited and held (:data:`QUIET`).
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from testbed import impl as bed_impl  # tests/ is on sys.path, as for the conftest

#: In the test bed's state directory: two checkouts that share one bed share its lanes too.
DIR = bed_impl.state_dir()

T = TypeVar("T")


@dataclass(frozen=True)
class Held:
    """One test's hold on ``lane.lock``: the open file its lock lives on, and where the lock files are."""

    fd: int
    where: Path


def _open(path: Path) -> int:
    path.parent.mkdir(exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)


@contextmanager
def shared(where: Path = DIR) -> Iterator[Held]:
    """A test's whole run: beside the other lane's test, never beside a quiet test's call."""
    gate = _open(where / "lane.turnstile")
    try:
        fcntl.flock(gate, fcntl.LOCK_SH)
    finally:
        os.close(gate)
    fd = _open(where / "lane.lock")
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield Held(fd, where)
    finally:
        os.close(fd)   # closing the description drops its lock


@dataclass
class Quiet:
    """What the quiet tests of this pytest cost: seconds waited for the other lane, and held alone."""

    tests: int = 0
    waited_s: float = 0.0
    held_s: float = 0.0

    def line(self) -> str:
        return (f"quiet tests: {self.tests}, waited {self.waited_s:.0f}s for the other lane's current test, "
                f"held the machine {self.held_s:.0f}s")


#: This process's quiet tests (the conftest prints it at the end of the session).
QUIET = Quiet()


@contextmanager
def alone(held: Held) -> Iterator[None]:
    """A quiet test's call: the other lane's current test ends, and its next waits for this one.

    pytest-timeout's alarm (its signal method) is paused while this waits: the other lane's test
    may take minutes, and that wait is not the quiet test's time."""
    left, _ = signal.setitimer(signal.ITIMER_REAL, 0)
    fcntl.flock(held.fd, fcntl.LOCK_UN)
    gate = _open(held.where / "lane.turnstile")
    t0 = time.monotonic()
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(held.fd, fcntl.LOCK_EX)
        t1 = time.monotonic()
        if left:
            signal.setitimer(signal.ITIMER_REAL, left)
        try:
            yield
        finally:
            fcntl.flock(held.fd, fcntl.LOCK_SH)   # at once: while this holds the turnstile, no one else can be exclusive
            QUIET.tests += 1
            QUIET.waited_s += t1 - t0
            QUIET.held_s += time.monotonic() - t1
    finally:
        os.close(gate)


def quiet_last(items: list[T], is_quiet: Callable[[T], bool], module: Callable[[T], object]) -> list[T]:
    """``items`` with every module that holds a quiet test moved to the end, each module's tests kept together
    and in order. At the end of the heavier lane, the quiet tests find the other lane finished, or nearly, and
    wait for none of its tests; at the end of the lighter one, they stop only the other's last minutes."""
    with_quiet = {module(i) for i in items if is_quiet(i)}
    return [i for i in items if module(i) not in with_quiet] + [i for i in items if module(i) in with_quiet]

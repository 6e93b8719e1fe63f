"""The two lanes' lock (tests/lanes.py): a quiet test waits for the other lane's running tests, then
has the machine alone; an ordinary test waits for a quiet one, and ordinary tests never wait for
each other. Each holder is a real second process, as the other lane is; each says when it got the
lock and when it let go, so the check reads the order, not the clock's speed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lanes
import pytest

HOLD = """
import contextlib, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import lanes
with lanes.shared(Path({where!r})) as held, (lanes.alone(held) if {quiet!r} else contextlib.nullcontext()):
    print(time.time(), flush=True)
    time.sleep({hold})
    print(time.time(), flush=True)
"""


def _holder(where: Path, how: str, hold: float) -> subprocess.Popen[str]:
    """A process that holds the lock as an ordinary test (``how`` "shared") or a quiet test's call
    ("alone") does, for ``hold`` s, with its locks in ``where``: not this suite's own, which this
    test's own run holds."""
    code = HOLD.format(tests=str(Path(lanes.__file__).parent), where=str(where), quiet=how == "alone", hold=hold)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def _got(p: subprocess.Popen[str]) -> float:
    """When ``p`` got the lock (it says so once it has)."""
    assert p.stdout is not None
    return float(p.stdout.readline())


def _held(p: subprocess.Popen[str], got: float) -> tuple[float, float]:
    """When ``p`` got the lock and when it let go (it says so before it does)."""
    assert p.stdout is not None
    let_go = float(p.stdout.readline())
    assert p.wait(timeout=30) == 0
    p.stdout.close()
    return got, let_go


@pytest.mark.timeout(60)
def test_ordinary_tests_share_and_a_quiet_one_waits_for_them_then_holds_the_others_off(tmp_path: Path) -> None:
    a, b = _holder(tmp_path, "shared", 3.0), _holder(tmp_path, "shared", 3.0)
    got_a, got_b = _got(a), _got(b)
    quiet = _holder(tmp_path, "alone", 2.0)
    got_quiet = _got(quiet)
    late = _holder(tmp_path, "shared", 0.1)
    got_late = _got(late)
    (a0, a1), (b0, b1) = _held(a, got_a), _held(b, got_b)
    q0, q1 = _held(quiet, got_quiet)
    late0, _ = _held(late, got_late)
    assert b0 < a1 and a0 < b1, "two ordinary tests ran one after the other"
    assert q0 >= max(a1, b1), "the quiet test began while an ordinary one still ran"
    assert late0 >= q1, "an ordinary test began during the quiet one"


@pytest.mark.timeout(60)
def test_two_quiet_tests_one_in_each_lane_take_turns(tmp_path: Path) -> None:
    first, second = _holder(tmp_path, "alone", 1.0), _holder(tmp_path, "alone", 1.0)
    (f0, f1), (s0, s1) = _held(first, _got(first)), _held(second, _got(second))
    assert f1 <= s0 or s1 <= f0, "two quiet tests ran at once"


ALARMED = """
import signal, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import lanes
fired = []
signal.signal(signal.SIGALRM, lambda *_: fired.append(time.time()))
with lanes.shared(Path({where!r})) as held:
    signal.setitimer(signal.ITIMER_REAL, 1.0)   # a test's timeout, as pytest-timeout arms it
    with lanes.alone(held):
        got = time.time()
        time.sleep(1.5)
print(got, fired[0] if fired else 0.0, lanes.QUIET.tests, lanes.QUIET.waited_s, lanes.QUIET.held_s, flush=True)
"""


@pytest.mark.timeout(60)
def test_a_quiet_tests_timeout_does_not_count_its_wait_for_the_other_lane(tmp_path: Path) -> None:
    other = _holder(tmp_path, "shared", 3.0)
    _got(other)
    code = ALARMED.format(tests=str(Path(lanes.__file__).parent), where=str(tmp_path))
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    got, fired, tests, waited, held = map(float, quiet.stdout.split())
    assert fired > got, "the alarm went off while the quiet test waited for the other lane, or never"
    assert other.wait(timeout=10) == 0
    # what the lane's report says of it: one quiet test, its wait for the other lane, its time alone
    assert tests == 1 and 0.5 < waited < 3.5 and 1.5 <= held < 5, (tests, waited, held)


@pytest.mark.timeout(10)
def test_modules_with_a_quiet_test_go_last_whole_and_in_order() -> None:
    items = ["a::1", "f::1", "f::2q", "f::3", "b::1", "s::1q", "c::1"]
    got = lanes.quiet_last(items, lambda i: i.endswith("q"), lambda i: i.split("::")[0])
    assert got == ["a::1", "b::1", "c::1", "f::1", "f::2q", "f::3", "s::1q"]
    assert lanes.quiet_last(items[:1], lambda i: False, lambda i: i) == items[:1]

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
import sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import lanes
with getattr(lanes, {how!r})(Path({where!r})):
    print(time.time(), flush=True)
    time.sleep({hold})
    print(time.time(), flush=True)
"""


def _holder(where: Path, how: str, hold: float) -> subprocess.Popen[str]:
    """A process in ``how`` (shared or alone) for ``hold`` s, with its locks in ``where``: not this
    suite's own, which this test's own run holds."""
    code = HOLD.format(tests=str(Path(lanes.__file__).parent), where=str(where), how=how, hold=hold)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def _got(p: subprocess.Popen[str]) -> float:
    """When ``p`` got the lock (it says so once it has)."""
    assert p.stdout is not None
    return float(p.stdout.readline())


def _held(p: subprocess.Popen[str], got: float) -> tuple[float, float]:
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0
    return got, float(out)


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

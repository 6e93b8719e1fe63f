"""The stall clock (higgsfield.node.gang.watchdog.Watchdog): pure, the time passed in."""

from __future__ import annotations

import pytest

from higgsfield.node.gang.watchdog import Watchdog

pytestmark = pytest.mark.timeout(30)


def test_before_the_first_progress_the_startup_timeout_applies() -> None:
    dog = Watchdog(stall_timeout=10, startup_timeout=100, started_at=1000)
    assert not dog.stalled(1099) and dog.stalled(1100) and dog.since(1050) == 50


def test_after_progress_the_stall_timeout_runs_from_the_newest_of_any_node() -> None:
    dog = Watchdog(stall_timeout=10, startup_timeout=100, started_at=1000)
    dog.progress("n1", 1005)
    dog.progress("n2", 1020)
    dog.progress("n1", 1003)   # older: changes nothing
    assert not dog.stalled(1029) and dog.stalled(1030) and dog.since(1025) == 5


def test_a_run_progressing_every_third_of_the_timeout_is_never_stalled() -> None:
    dog = Watchdog(stall_timeout=9, startup_timeout=0, started_at=0)
    for t in range(0, 300, 3):
        dog.progress("n", t)
        assert not dog.stalled(t + 2.99)


def test_zero_turns_either_timeout_off() -> None:
    dog = Watchdog(stall_timeout=0, startup_timeout=0, started_at=0)
    assert not dog.stalled(1e9)
    dog.progress("n", 1)
    assert not dog.stalled(1e9)


def test_a_restart_starts_over_and_ignores_reports_from_before_it() -> None:
    dog = Watchdog(stall_timeout=10, startup_timeout=50, started_at=0)
    dog.progress("n", 5)
    dog.restart(100)
    dog.progress("n", 90)     # sent before the restart
    assert not dog.started and not dog.stalled(149) and dog.stalled(150)

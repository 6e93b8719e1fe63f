"""A setup re-run and ``doctor`` take few SSH sessions per node, and doctor's clock skew is not biased by the login.

On the bench's delayed test-bed hosts (hfnode30-31 through bench/_bed.py, under its
lock): every SSH session waits 0.3 s (sshd ``ForceCommand``) and is logged one line
each, which is how the sessions are counted. Before the probe a re-run took 16
sessions per node and doctor 9-10, and doctor reported every loopback node +0.15 s
off (half the delayed login, taken as part of the clock's round trip).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.sshd, pytest.mark.docker]

REPO = Path(__file__).resolve().parents[2]
DELAY = 0.3
MAX_SESSIONS = 3


def _bed() -> ModuleType:
    import testbed  # tests/ is on sys.path (rootdir conftest)

    return testbed.bench_bed()


@pytest.fixture(scope="module")
def bed() -> Iterator[tuple[ModuleType, Any, list[Any]]]:
    """Two delayed bench hosts and a project set up on them (the first setup applies what is missing)."""
    if os.geteuid() != 0:
        pytest.skip("the test bed needs root")
    bed = _bed()
    with bed.bench_hosts(2, delay=DELAY) as hosts:
        project = bed.Project("probe_sessions", hosts)
        try:
            bed.first_setup(project)
            yield bed, project, hosts
        finally:
            project.remove()


def _sessions(bed: ModuleType, hosts: list[Any], project: Any, *args: str) -> tuple[Any, dict[str, list[str]]]:
    before = {h.name: bed.session_count(h) for h in hosts}
    r = project.hf(*args, check=False, timeout=120)
    return r, {h.name: bed.session_commands(h, before[h.name]) for h in hosts}


@pytest.mark.timeout(1200)
def test_a_setup_rerun_takes_at_most_three_sessions_per_node(bed: tuple[ModuleType, Any, list[Any]]) -> None:
    mod, project, hosts = bed
    r, sessions = _sessions(mod, hosts, project, "setup")
    assert r.code == 0, r.tail(30)
    assert "every step was already done, nothing changed" in r.out
    for node, commands in sessions.items():
        assert 1 <= len(commands) <= MAX_SESSIONS, (node, commands)


@pytest.mark.timeout(600)
def test_doctor_takes_at_most_three_sessions_per_node_and_its_skew_is_unbiased(
        bed: tuple[ModuleType, Any, list[Any]]) -> None:
    mod, project, hosts = bed
    r, sessions = _sessions(mod, hosts, project, "doctor", "--json")
    report = json.loads(r.out)
    for node, commands in sessions.items():
        assert 1 <= len(commands) <= MAX_SESSIONS, (node, commands)
    for n in report["nodes"]:
        checks = n["checks"]
        assert checks["ssh"]["ok"] and checks["sudo"]["ok"] and checks["invoker"]["ok"], checks
        assert checks["rendezvous"]["ok"], checks["rendezvous"]
        # the same clock: 0, give or take the exchange (not +DELAY/2, the login's half)
        assert abs(checks["clock"]["data"]["skew_s"]) < 0.05, checks["clock"]

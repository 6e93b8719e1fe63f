"""Fixtures for the fault tests: their own test-bed hosts, so stopping, freezing or rekeying one never
disturbs the other multi-node tests (which use hfnode0..2 at the same time).

- ``fault_bed``: the test bed (scripts/testbed/testbed.py) with hosts hfnode8..10 (127.0.0.10-12)
  up, with their own keys and no command delay; skipped when the bed is not up or not root.
- ``faults``: the project ``hffault`` on those three hosts (``make_cluster`` of tests/runs, so
  the same layout as the multi-node tests: Docker runtime, the invoker linked from one shared
  venv), plus ``src/ckpt_steps.py``, ``src/slow_node.py`` and ``src/slowrank.py`` (bench/straggler.py's),
  deployed once.

Every test puts back what it broke (hosts started, keys restored, delays cleared, tmpfs
unmounted) in ``finally``; the session teardown checks the hosts once more.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
RUNS = HERE.parent / "runs"
sys.path.insert(0, str(RUNS))  # runs_helpers (tests/ has no packages)

from faults_helpers import CKPT_STEPS, INDICES, SLOW_NODE, SLOW_RANK, FaultCluster  # noqa: E402
from runs_helpers import bed_for, exe, runs_conftest  # noqa: E402
from runs_helpers import restore_hosts as _restore_hosts  # noqa: E402


def _runs_conftest():  # type: ignore[no-untyped-def]
    return runs_conftest()


def restore_hosts(tb) -> None:  # type: ignore[no-untyped-def]
    """Hosts 8..10 exist, run sshd with no command delay; their users are in the docker group."""
    _restore_hosts(tb, INDICES)


def pin_hosts(tb, project: Path) -> None:  # type: ignore[no-untyped-def]
    """Pin the hosts' real keys in the project, as ``higgsfield setup`` does (nothing else trusts on first use)."""
    known = project / ".higgsfield" / "known_hosts"
    known.parent.mkdir(exist_ok=True)
    known.write_text("".join(tb.known_hosts_line(tb.make_host(i)) + "\n" for i in INDICES))


@pytest.fixture(scope="session")
def fault_bed():  # type: ignore[no-untyped-def]
    return bed_for(INDICES)


@pytest.fixture(scope="session")
def faults(fault_bed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultCluster]:  # type: ignore[no-untyped-def]
    base = _runs_conftest().make_cluster(fault_bed, tmp_path_factory.mktemp("faults") / "hffault", INDICES)
    c = FaultCluster(base.dir, base.bed, base.nodes, indices=INDICES)
    (c.dir / "src" / "ckpt_steps.py").write_text(CKPT_STEPS)
    (c.dir / "src" / "slow_node.py").write_text(SLOW_NODE)
    (c.dir / "src" / "slowrank.py").write_text(SLOW_RANK)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run([exe("git"), "add", "-A"], cwd=c.dir, check=True, env=env)
    subprocess.run([exe("git"), "commit", "-qm", "ckpt_steps"], cwd=c.dir, check=True, env=env)
    pin_hosts(fault_bed, c.dir)
    c.hf("deploy", check=True, timeout=900)
    yield c
    restore_hosts(fault_bed)


@pytest.fixture(autouse=True)
def _hosts_back(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each fault test the three hosts are up as before, whatever the test did."""
    yield
    if "faults" in request.fixturenames or "fault_bed" in request.fixturenames:
        restore_hosts(request.getfixturevalue("fault_bed"))

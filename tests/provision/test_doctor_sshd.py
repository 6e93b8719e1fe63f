"""``higgsfield doctor`` on the test bed: read-only, parallel, in seconds, one line per problem with its fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testbed import Testbed

pytestmark = [pytest.mark.slow, pytest.mark.sshd]


def _doctor(project: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIGGSFIELD_")}
    env["COLUMNS"] = "250"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=project, env=env,  # noqa: S603
                          capture_output=True, text=True, timeout=120, check=False)
    spent = time.monotonic() - start
    print(f"\nhiggsfield {' '.join(args)}: exit {proc.returncode} in {spent:.1f}s\n{proc.stdout}{proc.stderr}")
    return proc, spent


@pytest.fixture
def doctor_project(testbed: Testbed, tmp_path: Path) -> Path:
    bed = testbed
    nodes = "".join(f"  - host: {h.address}\n    port: {h.port}\n    user: {h.user}\n    name: {h.name}\n"
                    for h in bed.hosts[:4])
    (tmp_path / "higgsfield.yml").write_text(
        f"name: doctor_e2e\nnodes:\n{nodes}ssh:\n  identity_file: {bed.client_key}\n"
        "  connect_timeout: 3\n  retries: 0\n")
    return tmp_path


def test_doctor_reports_every_node_read_only(testbed: Testbed, doctor_project: Path) -> None:
    known = doctor_project / ".higgsfield" / "known_hosts"
    # unpinned: refused before authentication, reported with the fix, and nothing runs there
    proc, spent = _doctor(doctor_project, "doctor", "--json")
    report = json.loads(proc.stdout)
    assert spent < 20 and proc.returncode == 1
    assert not known.exists()  # read-only: nothing pinned
    for node in report["nodes"]:
        c = node["checks"]
        assert c["host key"]["summary"] == "not pinned" and c["host key"]["fix"].startswith("higgsfield setup")
        assert "sudo" not in c and "docker" not in c
    assert any("not pinned in .higgsfield/known_hosts" in p and "fix: higgsfield setup" in p
               for p in report["problems"])

    known.parent.mkdir()
    testbed.write_known_hosts(known, testbed.hosts[:4])
    proc, spent = _doctor(doctor_project, "doctor", "--json")
    report = json.loads(proc.stdout)
    assert spent < 20
    assert len(report["nodes"]) == 4
    for node in report["nodes"]:
        c = node["checks"]
        assert c["ssh"]["ok"] and c["sudo"]["summary"] == "passwordless"
        assert c["host key"]["summary"] == "matches"
        assert c["gpus"] == {"ok": True, "summary": "none", "problem": None, "fix": None, "data": {"count": 0}}
        assert abs(c["clock"]["data"]["skew_s"]) < 2
        assert c["disk"]["data"]["free_gib"]["checkpoints"] > 0
    ranks = {n["rank"]: n for n in report["nodes"]}
    assert ranks[0]["checks"]["rendezvous"]["summary"].startswith("listens :")
    for r in (1, 2, 3):
        assert ranks[r]["checks"]["rendezvous"]["ok"], ranks[r]["checks"]["rendezvous"]


def test_doctor_names_an_unreachable_node_with_the_fix(testbed: Testbed, doctor_project: Path) -> None:
    with testbed.host_stopped(3) as victim:
        proc, spent = _doctor(doctor_project, "doctor")
    assert proc.returncode == 1 and spent < 20
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(f"✗ {victim.name}: ssh:"))
    assert "cannot connect" in line and f"fix: check that the node is up and sshd listens on {victim.address}" in line
    assert "problem(s) on 4 of 4 node(s)" in proc.stderr  # the others: unpinned keys

"""``higgsfield profile`` of a live run of 2 nodes x 2 ranks on the test bed (hosts hfnode37, hfnode38).

Real sshd nodes, real torchrun on CPU (gloo), the Docker runtime (as the stacks test of
tests/runs/test_multinode.py: the ranks run in containers, the request and the traces pass through
the run directory mounted at its own path; its deploy takes seconds where the process runtime's
builds a torch venv per node, about 110 s on a fresh bed; the process runtime is
tests/control/test_profile_cli.py's): ``profile --steps 3`` while the run trains; 4 Chrome traces
come home over SSH (SFTP, pull's fetch), each holding the 3 profiled steps, the merged timeline
holds all 4 ranks, and the run goes on to succeed with the losses it would have had unprofiled.
Then the ended run is refused in one line, exit 2.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from profile_helpers import STEPS, check_traces, expected_losses, losses
from runs_helpers import Cluster, bed_for, exe, runs_conftest, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.sshd, pytest.mark.docker]

HOSTS = (37, 38)
PROJECT = "hfprof"


class ProfCluster(Cluster):
    def run_dir(self, i: int, run: str) -> Path:
        return self.home(i) / ".hfrt" / "runs" / PROJECT / run


@pytest.fixture(scope="module")
def prof_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProfCluster]:
    tb = bed_for(HOSTS)
    base = runs_conftest().make_cluster(tb, tmp_path_factory.mktemp("prof") / PROJECT, HOSTS)
    c = ProfCluster(base.dir, base.bed, base.nodes)
    (c.dir / "src" / "steps.py").write_text(STEPS)
    yml = c.dir / "higgsfield.yml"
    yml.write_text(yml.read_text().replace("nproc_per_node: 1\n", "nproc_per_node: 2\n"))
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["add", "-A"], ["commit", "-qm", "profile"]):
        subprocess.run([exe("git"), *args], cwd=c.dir, check=True, capture_output=True, env={**os.environ, **env})
    t0 = time.monotonic()
    c.hf("deploy", check=True, timeout=900)
    print(f"deploy (docker, 2 nodes): {time.monotonic() - t0:.1f}s")
    yield c


@pytest.mark.timeout(300)
def test_profile_of_a_live_2x2_run_brings_4_traces_home_and_the_run_succeeds(prof_cluster: ProfCluster) -> None:
    c, run = prof_cluster, f"prof-{uuid.uuid4().hex[:6]}"   # the bed keeps old runs' logs
    c.hf("run", "steps", "--run-name", run, "-d", "--param", "steps=100000", "--param", "step_sleep=0.05",
         "--param", "gate=enough", check=True, timeout=120)
    log = c.run_dir(HOSTS[1], run) / "logs" / "rank3.log"
    try:
        t_start = time.monotonic()
        wait_for(lambda: log.exists() and "step 3 loss" in log.read_text(errors="replace"), 180, "rank 3's step 3")
        print(f"\nthe 4 ranks at step 3: {time.monotonic() - t_start:.1f}s")
        t0 = time.monotonic()
        r = c.hf("profile", run, "--steps", "3", "--out", "prof", check=True, timeout=120)
        took = time.monotonic() - t0
        print(f"\nprofile of 3 steps on 2 nodes x 2 ranks: {took:.1f}s\n{r.stdout}")
        check_traces(c.dir / "prof", [0, 1, 2, 3], 3)
        for who in ("hfnode37/0", "hfnode37/1", "hfnode38/2", "hfnode38/3"):
            assert any(ln.startswith(f"{who}: 3 step(s), ") for ln in r.stdout.splitlines()), r.stdout
        assert took < 30, took   # the target is 10 s plus the steps (bench/profile_cost.py); room for a loaded bed
        for i in HOSTS:   # the run went on: let it end (every rank at the same step: the gate is agreed)
            gate = c.run_dir(i, run) / "enough"
            gate.write_text("")
            shutil.chown(gate, f"hfnode{i}", f"hfnode{i}")
        wait_for(lambda: all(json.loads((c.run_dir(i, run) / "run.json").read_text()).get("state")
                             not in ("running", "starting") for i in HOSTS), 90, "the run's end")
    finally:   # a failure leaves nothing running on the bed
        for i in HOSTS:
            if not (c.run_dir(i, run) / "enough").exists():
                c.hf("kill", run, timeout=60)
                break
    print(f"the run ended: {time.monotonic() - t_start:.1f}s after its start")
    states = [json.loads((c.run_dir(i, run) / "run.json").read_text())["state"] for i in HOSTS]
    assert states == ["succeeded", "succeeded"], states
    got = losses((c.run_dir(HOSTS[0], run) / "logs" / "rank0.log").read_text(errors="replace"))
    steps = len(got)
    want = expected_losses(4, steps)
    assert sorted(got) == list(range(steps)) and steps > 6
    assert all(abs(got[i] - want[i]) <= 1e-5 * max(1.0, abs(want[i])) for i in range(steps)), (got, want)
    r = c.hf("profile", run, timeout=60)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"error: run '{run}' is succeeded, not running: only a live run can be profiled\n"

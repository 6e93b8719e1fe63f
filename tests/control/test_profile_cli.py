"""``higgsfield profile`` on a ``localhost`` node (no SSH, process runtime): a live 2-rank run profiled.

The run's ranks read the request beside their progress write, profile their next 3 steps and
write Chrome traces; they come home with the merged timeline, the summary is printed, and the run
goes on to succeed with the losses it would have had unprofiled. A run that ended, an unknown run
and bad flags are one line, exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers_project import local_project
from profile_helpers import STEPS, check_traces, expected_losses, losses

RUN = "prof-live"


def hf(project: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "TERM": "dumb"}
    return subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=project, capture_output=True,
                          text=True, timeout=timeout, env=env)


def _log(project: Path, rank: int) -> str:
    p = project.parent / "state" / "runs" / "profproj" / RUN / "logs" / f"rank{rank}.log"
    return p.read_text(errors="replace") if p.exists() else ""


@pytest.mark.slow   # a real torchrun of 2 ranks: make test runs it, make test-fast does not
@pytest.mark.timeout(120)
def test_a_live_run_is_profiled_and_goes_on(tmp_path: Path) -> None:
    proj = local_project(tmp_path, "profproj", {"steps.py": STEPS}, nproc=2)
    # the run goes until the test opens its gate: a loaded machine's slow profile never finds it ended
    r = hf(proj, "run", "steps", "--run-name", RUN, "-d", "--param", "steps=3000", "--param", "step_sleep=0.1",
           "--param", "gate=enough")
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 60
    while "step 3 loss" not in _log(proj, 1) and time.monotonic() < deadline:
        time.sleep(0.2)
    t0 = time.monotonic()
    r = hf(proj, "profile", RUN, "--steps", "3", "--memory", "--out", "prof")
    took = time.monotonic() - t0
    print(f"profile: {took:.1f}s\n{r.stdout}{r.stderr}")
    assert r.returncode == 0, r.stderr
    check_traces(proj / "prof", [0, 1], 3)
    out = r.stdout.splitlines()
    for rank in (0, 1):
        line = next(ln for ln in out if ln.startswith(f"localhost/{rank}: 3 step(s), "))
        assert "compute " in line and "communication " in line and "waiting " in line
    assert any("c10d::allreduce_" in ln for ln in out), r.stdout
    assert out.count("    no CUDA memory snapshot: this rank runs on CPU") == 2
    assert "every rank in one timeline: prof/merged.trace.json" in r.stdout
    # how long it takes is bench/profile_cost.py's to measure, not a test's to assert under load
    r = hf(proj, "profile", RUN, "--rank", "7")   # no such rank: one line, exit 2, at once
    assert (r.returncode, r.stderr) == (2, f"error: run '{RUN}' has no live rank 7 to profile\n"), r.stderr
    # the run goes on, and profiling changed none of its losses
    (proj.parent / "state" / "runs" / "profproj" / RUN / "enough").write_text("")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        st = {x["run"]: x for x in json.loads(hf(proj, "status", "--json").stdout)["runs"]}
        if st[RUN]["state"] != "running":
            break
        time.sleep(0.5)
    assert st[RUN]["state"] == "succeeded", st[RUN]
    got = losses(_log(proj, 0))
    n = len(got)
    want = expected_losses(2, n)
    assert 3 < n < 3000 and sorted(got) == list(range(n))   # it went on past the profile, to the gate
    assert all(abs(got[i] - want[i]) <= 1e-5 * max(1.0, abs(want[i])) for i in range(n)), (got, want)
    # a run that ended, and one that never was: one line, exit 2
    r = hf(proj, "profile", RUN)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"error: run '{RUN}' is succeeded, not running: only a live run can be profiled\n"
    r = hf(proj, "profile", "nosuch")
    assert r.returncode == 2 and r.stderr.startswith("error: no run") and r.stderr.count("\n") == 1
    r = hf(proj, "profile", RUN, "--steps", "0")
    assert r.returncode == 2 and "Traceback" not in r.stderr

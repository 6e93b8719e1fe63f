"""A slow rank named end to end: ``higgsfield run`` on a localhost node (real torchrun, supervisor, coordinator and
gang wire), one rank of four made 1.3x slower per step after step 25: it is named within 20 steps, in the record,
``status --json`` and the launcher log, and no other rank is named at any time (each naming is a log line)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_straggler", REPO / "bench" / "straggler.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.quiet   # it times 4 ranks' steps on 2 cores: the other lane would slow some more than others
@pytest.mark.timeout(180)
def test_a_rank_13x_slower_is_named_within_20_steps_and_no_healthy_rank_ever_is(tmp_path: Path) -> None:
    bench = _bench()
    proj, state = bench.project(tmp_path, 4)
    slow_from, run = 25, "slow-1"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HIGGSFIELD_NO_PY_SPY": "1"}
    argv = [sys.executable, "-m", "higgsfield", "run", "slowrank", "--run-name", run]
    for k, v in {"steps": slow_from + 25, "work": 0.15, "matmuls": 20, "slow_rank": 3, "slow_from": slow_from,
                 "factor": 1.3}.items():
        argv += ["--param", f"{k}={v}"]
    r = subprocess.run(argv, cwd=proj, env=env, capture_output=True, text=True, timeout=170)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rd = state / "runs" / "benchstraggler" / run
    (s,) = json.loads((rd / "run.json").read_text())["stragglers"]
    timeline = [(int(a), float(b)) for a, b in (ln.split() for ln in (rd / "timeline.txt").read_text().splitlines())]
    named_at_step = bench.step_at(timeline, s["at"])
    assert (s["node"], s["rank"]) == ("localhost", 3) and 1.2 <= s["ratio"] <= 1.4, s
    assert slow_from <= named_at_step <= slow_from + 20 and abs(s["since_step"] - slow_from) <= 3, (named_at_step, s)
    log = (rd / "logs" / "launcher.log").read_text()
    assert [ln for ln in log.splitlines() if "straggler:" in ln] == [
        ln for ln in log.splitlines() if "straggler: rank 3 on localhost is 1." in ln], log[-3000:]
    st = subprocess.run([sys.executable, "-m", "higgsfield", "status", "--json"], cwd=proj, env=env,
                        capture_output=True, text=True, timeout=60, check=True)
    (got,) = [x for x in json.loads(st.stdout)["runs"] if x["run"] == run]
    assert [(x["node"], x["rank"], x["since_step"]) for x in got["stragglers"]] == [("localhost", 3, s["since_step"])]

"""``higgsfield status`` in a pipe (COLUMNS=80, 60): run names are printed whole, whatever else gives way.

The runs are real records in a localhost node's state directory, read back by the
real ``invoker status`` (finished runs: nothing to start).
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

from higgsfield.contract.nodepart import NodePart
from higgsfield.contract.runstatus import RunStatus
from higgsfield.control.cli._status_table import layout

pytestmark = pytest.mark.timeout(120)

RUNS = [  # (run, experiment, state, failed rank): long names, as generated and as users pick them
    ("tiny_llama-20261201-183005-ab12", "tiny_llama", "succeeded", None),
    ("tiny_llama_finetune_sweep-lr3e-4-warmup500-bs64-seed1234", "tiny_llama_finetune_sweep", "failed", 3),
    ("regression-20261130-101500-ffff", "regression", "killed", None),
]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("status")
    proj = local_project(root, "localproj", {})
    state = root / "state"
    now = time.time()
    for i, (run, exp, st, rank) in enumerate(RUNS):
        rd = state / "runs" / "localproj" / run
        rd.mkdir(parents=True)
        rd.chmod(0o700)
        record = {"project": "localproj", "experiment": exp, "run": run, "node": "localhost", "node_rank": 0,
                  "nnodes": 1, "nproc": 2, "state": st, "created_at": now - 3600 + i, "started_at": now - 3500 + i,
                  "ended_at": now - 100, "exit_code": 0 if st == "succeeded" else 1}
        if rank is not None:
            record.update(failed_node="localhost", failed_rank=rank, failed_at=now - 100,
                          reason=f"rank {rank} exited 1", error_tail=["ValueError: boom"])
        (rd / "run.json").write_text(json.dumps(record))
    return proj


def status(project: Path, columns: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "dumb"}
    return subprocess.run([sys.executable, "-m", "higgsfield", "status"], cwd=project, capture_output=True,
                          text=True, timeout=60, env=env)


@pytest.mark.parametrize("columns", [200, 80, 60])
def test_status_prints_every_run_name_whole(project: Path, columns: int) -> None:
    r = status(project, columns)
    assert r.returncode == 0, r.stderr
    table = r.stdout.split("\n\n")[0].splitlines()
    assert table[0].split()[0] == "RUN" and "STATE" in table[0]
    for (run, _, st, _), line in zip(RUNS, table[1:], strict=True):
        assert line.split()[:1] == [run], line        # the whole name, first, as it can be copied
        assert st in line.split()
    assert "…" not in "".join(line.split()[0] for line in table)
    # the columns stay put: every row's STATE starts where its title does
    at = table[0].index("STATE")
    assert all(line[at:].split()[0] in ("succeeded", "failed", "killed") for line in table[1:])
    # other columns give way only when they must; the failure is printed whole below the table
    if columns >= 200:
        assert "EXPERIMENT" in table[0] and time.strftime("%Y-") in r.stdout and "localhost rank 3" in table[2]
    longest = max(len(run) for run, *_ in RUNS)
    if longest + 2 + len("succeeded") <= columns:   # the name and its state fit: so does every line
        assert all(len(line) <= columns for line in table), table
    assert "first failure on localhost rank 3:" in r.stdout and "| ValueError: boom" in r.stdout


def test_dates_shorten_before_any_column_goes() -> None:
    now = time.time()
    runs = [RunStatus("p", "tiny_llama", "tiny_llama-20261201-183005-ab12", "running", {"hfnode1": NodePart("running")}, now,
                      now)]
    titles, widths, rows = layout(runs, 110)
    assert titles == ["RUN", "EXPERIMENT", "STATE", "NODES", "STARTED", "DURATION", "EXIT", "FIRST FAILURE"]
    assert rows[0][4] == time.strftime("%m-%d %H:%M", time.localtime(now))
    assert sum(widths) + 2 * (len(widths) - 1) <= 110
    titles, widths, rows = layout(runs, 80)   # then whole columns: the experiment (the name's start) first
    assert titles[:2] == ["RUN", "STATE"] and "EXPERIMENT" not in titles and "STARTED" in titles
    assert sum(widths) + 2 * (len(widths) - 1) <= 80
    titles, _, rows = layout(runs, 200)
    assert rows[0][4] == time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    titles, _, rows = layout(runs, 10)   # narrower than the name: the name still whole, beside its state
    assert titles == ["RUN", "STATE"] and rows[0] == ["tiny_llama-20261201-183005-ab12", "running"]

"""The Slurm stall watchdog's parts without a cluster: the stacks step's words and output, the batch step's
watch over a real run directory, and the status a stalled job shows. The job itself: tests/slurm/test_slurm_stall.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.layout import node_of_rank, ranks_of_node
from higgsfield.contract.runspec import RunSpec, read_spec
from higgsfield.contract.runstatus import status_json
from higgsfield.contract.slurm_stacks import TASK_MODULE, parse_srun, srun_argv
from higgsfield.contract.slurmjob import SlurmJob
from higgsfield.contract.stacks import Diagnosis, Frame, RankStacks, Thread
from higgsfield.control.backends.slurm.parse import Job
from higgsfield.control.backends.slurm.runstatus import merge
from higgsfield.control.backends.stall import stall_fields
from higgsfield.node import slurm_stall
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import RunDir, RunRecord

pytestmark = pytest.mark.timeout(30)


def _rank(node: str, rank: int, where: str, line: int) -> RankStacks:
    frames = (Frame("main", "/code/src/train.py", 10), Frame(where, "/code/src/train.py", line, "x()"))
    return RankStacks(node, rank, 100 + rank, (Thread("MainThread", frames),))


def test_the_stacks_step_runs_the_slurm_task_beside_the_job() -> None:
    """The login node (``higgsfield stacks``) and the batch step (at a stall) start this srun step."""
    argv = srun_argv("42", 2, "/v/bin/python", "/w/runs/p/r")
    assert argv[-4:] == ["-m", TASK_MODULE, "stacks", "/w/runs/p/r"]
    assert {"--overlap", "--jobid=42", "--nodes=2", "--label"} <= set(argv) and argv[0] == "timeout"


def test_labelled_pieces_are_put_back_together_per_node() -> None:
    """srun --label cuts a long line into ~1 KiB pieces that interleave across tasks: each node's line is whole
    again, and a node that gave none (or an error) is named."""
    n1 = json.dumps({"node": "n1", "ranks": [encode(_rank("n1", r, "all_reduce", 88)) for r in (0, 1)]})
    n2 = json.dumps({"node": "n2", "error": "OSError: no such process"})
    pieces = [(0, n1[i:i + 100]) for i in range(0, len(n1), 100)]
    out = []
    for i, (task, text) in enumerate(pieces):
        out.append(f"{task}: {text}")
        if i == 3:
            out.append(f"1: {n2}")
    text = "\n".join(out) + "\nsrun: warning: something\n"
    found, missing = parse_srun(text, ["n1", "n2", "n3"])
    assert [(s.node, s.rank) for s in found] == [("n1", 0), ("n1", 1)]
    assert missing["n2"].startswith("OSError") and "n3" in missing and "n1" not in missing
    found, missing = parse_srun("0: {not json\n", ["n1"])
    assert found == [] and set(missing) == {"?", "n1"}


def test_each_node_takes_only_its_own_ranks() -> None:
    """Group ranks follow the sorted host names (torch's c10d rendezvous), nproc each."""
    assert list(ranks_of_node(["n2", "n1"], 2, "n1")) == [0, 1]
    assert list(ranks_of_node(["n2", "n1"], 2, "n2")) == [2, 3]
    assert list(ranks_of_node(["n1"], 2, "n9")) == []
    assert [node_of_rank(["n2", "n1"], 2, r) for r in (-1, 0, 1, 2, 3, 4)] == [None, "n1", "n1", "n2", "n2", None]


def _run_dir(tmp_path: Path, spec: RunSpec) -> RunDir:
    rd = RunDir(NodeState(tmp_path), spec.project, spec.run)
    rd.make()
    rd.write(RunRecord(project=spec.project, experiment=spec.experiment, run=spec.run, node="n1", node_rank=0,
                       nnodes=2, nproc=2, state="running", runtime="slurm", reason="Slurm job 7"))
    return rd


def _progress(rd: RunDir, rank: int, step: int, at: float) -> None:
    path = rd.path / "progress" / f"rank{rank}"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"{step} {at:.3f}\n")


@pytest.mark.parametrize("on_stall", ["wait", "fail"])
def test_the_watch_finds_a_stall_keeps_its_diagnosis_and_sees_progress_again(tmp_path: Path, on_stall: str) -> None:
    spec = RunSpec(project="p", experiment="e", run="r1", module="m", code_dir="/c", params={}, node="n1",
                   node_rank=0, nodes=("n1", "n2"), master_addr="n1", submitted_at=1.0, stall_timeout=5,
                   startup_timeout=60, on_stall=on_stall)
    rd = _run_dir(tmp_path, spec)
    t0 = float(int(time.time()))
    taken = [_rank("n1", 0, "all_reduce", 88), _rank("n1", 1, "sleep", 17), _rank("n2", 2, "all_reduce", 88)]
    calls = []

    def take() -> tuple[list[RankStacks], dict[str, str]]:
        calls.append(1)
        return taken, {}

    watch = slurm_stall.StallWatch(rd, spec, t0, take)
    assert watch.tick(t0 + 50) is None                 # no progress yet: the startup allowance (60 s) holds
    _progress(rd, 0, 3, t0 + 51)
    assert watch.tick(t0 + 55) is None                 # progressed 4 s ago
    assert watch.tick(t0 + 56) == "stalled" and calls == [1]
    assert watch.stall is not None and watch.stall.reason.startswith("stalled: ")
    assert "n1/1 is at train.py:17 `x()`" in watch.stall.reason, watch.stall.reason
    record = rd.read()
    assert record.stall is not None and record.stall.odd == ("n1/1",) and record.stalled_at == t0 + 56
    saved = json.loads((rd.path / "stacks.json").read_text())
    assert [r["rank"] for r in saved["ranks"]] == [0, 1, 2]
    assert watch.tick(t0 + 60) is None and calls == [1]   # one stall, one taking
    _progress(rd, 2, 4, t0 + 61)
    assert watch.tick(t0 + 62) == "progressing" and watch.stall is None


def test_a_stalled_job_reads_stalled_while_slurm_runs_it() -> None:
    diagnosis = {"groups": [], "odd": ["n1/1"], "summary": "n1/1 is at x.py:3"}
    record = encode(RunRecord(project="p", experiment="e", run="r", node="n1", node_rank=0, nnodes=2, nproc=2,
                              state="stalled", reason="stalled: n1/1 is at x.py:3",
                              stall=decode(Diagnosis, diagnosis)))
    st = merge(SlurmJob("5"), Job("5", "RUNNING", nodes=("n1", "n2")), record)
    assert (st.state, st.reason, st.active) == ("stalled", "stalled: n1/1 is at x.py:3", True)
    assert st.stall is not None and st.stall.odd == ("n1/1",)
    assert status_json(st)["stall"] == diagnosis          # status --json carries it
    assert stall_fields(st)["stall"] == diagnosis       # and keeps it: the CLI and the page add these fields
    assert merge(SlurmJob("5"), None, {**record, "stall": {"odd": 3}}).stall is None   # one that does not decode
    failed = merge(SlurmJob("5"), Job("5", "FAILED", "NonZeroExitCode", 1, ("n1", "n2")),
                   {**record, "state": "failed", "failed_node": "n1", "failed_rank": 1})
    assert (failed.state, failed.reason, failed.failed_node, failed.failed_rank) == \
        ("failed", "stalled: n1/1 is at x.py:3", "n1", 1)


def test_the_stacks_task_answers_for_its_node_even_with_nothing_to_take(tmp_path: Path) -> None:
    """No ranks armed (yet): an empty list, not an error; no spec at all: an error line naming the node."""
    spec = RunSpec(project="p", experiment="e", run="r2", module="m", code_dir="/c", params={}, node="n1",
                   node_rank=0, nodes=("n1", "n2"), master_addr="n1", submitted_at=1.0, nproc=2)
    rd = _run_dir(tmp_path, spec)
    line = json.loads(slurm_stall.node_stacks(rd, "n1"))   # spec.json missing
    assert line["node"] == "n1" and "spec.json" in line["error"], line
    (rd.path / "spec.json").write_text(json.dumps(encode(spec)))
    os.chmod(rd.path / "spec.json", 0o600)
    assert json.loads(slurm_stall.node_stacks(rd, "n1")) == {"node": "n1", "ranks": []}


def test_the_runs_stall_settings_reach_the_jobs_spec(tmp_path: Path) -> None:
    """``run --stall-timeout/--startup-timeout/--on-stall`` (else higgsfield.yml's) reach request.json's spec."""
    from test_backend import SLURM, project

    from higgsfield.contract.errors import ConfigError
    from higgsfield.contract.stall_policy import OnStall, StallPolicy
    from higgsfield.control.backends import RunRequest, backend_for
    from higgsfield.control.backends.slurm import template_spec

    backend = backend_for(project(tmp_path, SLURM))
    plan = backend.plan(RunRequest("probe", stall_timeout=30, on_stall="wait"))
    assert plan.stall == StallPolicy(30.0, 1800.0, OnStall.WAIT)   # type: ignore[attr-defined]
    assert backend.plan(RunRequest("probe")).stall == StallPolicy()   # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="--on-stall"):
        backend.plan(RunRequest("probe", on_stall="panic"))
    spec = template_spec(project="p", experiment="probe", run="r", module="m", code_dir="/c", params={},
                         **plan.stall.spec_fields())   # type: ignore[attr-defined]
    back = read_spec(json.loads(json.dumps(encode(spec))))
    assert (back.stall_timeout, back.startup_timeout, back.on_stall) == (30.0, 1800.0, "wait")

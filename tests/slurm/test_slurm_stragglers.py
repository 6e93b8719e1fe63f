"""A Slurm job's batch step names the slow rank by its own work per step, as an SSH run's coordinator does.

The ranks' work lines are written where a job's ranks write them (``progress/work<N>`` of the run's
directory, which is in the shared workdir), by the contract's own writer; the batch step's watch
(:class:`higgsfield.node.slurm_stall.StallWatch`) reads them once a second. No cluster is needed for the
rule and the record; the job's ranks on the bed write the same files (test_slurm_stall.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from higgsfield.contract import layout
from higgsfield.contract.slurmjob import SlurmRequest
from higgsfield.contract.straggler import RankWork, work_line
from higgsfield.control.backends.slurm import template_spec
from higgsfield.node import slurm_task
from higgsfield.node.slurm_stall import StallWatch
from higgsfield.node.state.records import RunRecord

pytestmark = pytest.mark.timeout(30)


def _write(run_dir: Path, rank: int, step: int, own_s: float) -> None:
    path = layout.work_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(work_line(RankWork(rank=rank, step=step, steps=4, own_s=own_s, step_s=0.5), at=float(step)))
    os.replace(tmp, path)


def test_the_batch_step_names_a_slow_rank_with_its_node_and_clears_it(tmp_path: Path) -> None:
    rd = slurm_task.run_dir(str(tmp_path / "runs" / "p" / "r"))
    rd.make()
    spec = slurm_task.pin_spec(SlurmRequest(spec=template_spec(project="p", experiment="e", run="r", module="e",
                                                               code_dir="/w", params={}, nproc=2)),
                               ["n2", "n1"], "n2")
    rd.write(RunRecord(project="p", experiment="e", run="r", node="n2", node_rank=0, nnodes=2, nproc=2,
                       state="running", runtime="slurm"))
    watch = StallWatch(rd, spec, 0.0, lambda: ([], {}))
    for step in range(4, 80, 4):   # rank 3 (on n2: ranks follow the sorted host names) 30% slower from step 40
        for rank in range(4):
            _write(rd.path, rank, step, 0.13 if rank == 3 and step > 40 else 0.1)
        watch.judge(float(step))
        named = rd.read().stragglers
        if step <= 40:
            assert named == [], (step, named)
    assert [(s.node, s.rank) for s in named] == [("n2", 3)], named
    assert 1.25 < named[0].ratio < 1.35 and 37 <= named[0].since_step <= 44, named[0]
    for step in range(80, 140, 4):   # it recovers: cleared
        for rank in range(4):
            _write(rd.path, rank, step, 0.1)
        watch.judge(float(step))
    assert rd.read().stragglers == []


def test_the_login_node_asks_the_ranks_that_armed_in_the_jobs_current_start(tmp_path: Path) -> None:
    """``higgsfield profile`` on Slurm: the login node's invoker reads the shared run directory, where it finds
    no worker of its own; it asks the ranks that armed since the job's current start (a requeued job's earlier
    ranks are gone), and says which did not answer."""
    import json

    from higgsfield.contract.codec import encode
    from higgsfield.node.runs.profile import NotProfiled, profile
    from higgsfield.node.runs.stacks import Armed
    from higgsfield.node.state.records import write_json

    rd = slurm_task.run_dir(str(tmp_path / "runs" / "p" / "r"))
    rd.make()
    rd.write(RunRecord(project="p", experiment="e", run="r", node="n1", node_rank=0, nnodes=2, nproc=1,
                       state="running", runtime="slurm", started_at=100.0))
    for rank, at in ((0, 150.0), (1, 50.0)):   # rank 1 armed in the job's earlier start only
        write_json(rd.path / layout.STACKS / f"rank{rank}.json", encode(Armed(pid=1, main=1, time=at)))
    reply = profile(rd, steps=1, timeout=1.0)
    assert (reply.done, reply.missing) == ([], [0]), reply
    request = json.loads((rd.path / "profile" / "request.json").read_text())
    assert request["ranks"] == [0] and request["steps"] == 1, request
    record = rd.read()
    record.state = "succeeded"
    rd.write(record)
    with pytest.raises(NotProfiled, match="is succeeded, not running"):
        profile(rd, steps=1, timeout=1.0)

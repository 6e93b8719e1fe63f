"""A Slurm run that loses a node, without a cluster: what ``run`` asks of Slurm, how the job counts its attempts
and hands a requeue's reason to the next start, and how ``status`` shows the recovery (the real job on the bed:
test_slurm_recovery.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slurm_helpers import offline_backend

from higgsfield.contract.codec import encode
from higgsfield.contract.errors import ConfigError
from higgsfield.contract.runstatus import status_json
from higgsfield.contract.slurmjob import SlurmJob
from higgsfield.control.backends.backend import RunRequest
from higgsfield.control.backends.slurm.layout import RunPaths
from higgsfield.control.backends.slurm.parse import Job
from higgsfield.control.backends.slurm.runstatus import merge
from higgsfield.control.backends.slurm.script import BatchJob
from higgsfield.node import slurm_recovery
from higgsfield.node.slurm_run import run_dir
from higgsfield.node.state.records import Attempt, RunRecord

pytestmark = pytest.mark.timeout(30)


def test_run_takes_the_recovery_options_on_slurm_and_refuses_spares(tmp_path: Path) -> None:
    backend = offline_backend(tmp_path)
    plan = backend.plan(RunRequest("probe", {}))
    assert (plan.max_recoveries, plan.min_nodes) == (3, 0)   # a lost node is recovered from by default
    plan = backend.plan(RunRequest("probe", {}, min_nodes=1, max_recoveries=1))
    assert (plan.max_recoveries, plan.min_nodes) == (1, 1)
    assert backend.plan(RunRequest("probe", {}, min_nodes=2)).min_nodes == 0   # all of them: no shrinking
    with pytest.raises(ConfigError, match=r"^--min-nodes 3: the run asks for 2 node\(s\); give 1 to 2"):
        backend.plan(RunRequest("probe", {}, min_nodes=3))
    with pytest.raises(ConfigError, match=r"^--spares is for SSH nodes: on Slurm the partition's free nodes"):
        backend.plan(RunRequest("probe", {}, spares=1))


def test_a_run_that_recovers_is_submitted_requeue_able() -> None:
    job = BatchJob(paths=RunPaths("/w", "p", "r"), python="/w/venv/bin/python", nodes=2, recover=True)
    opts = job.sbatch_options()
    assert "--requeue" in opts and "--open-mode=append" in opts and "--no-requeue" not in opts


@pytest.mark.parametrize(("state", "gone"), [
    ("idle", False), ("allocated", False), ("mixed", False), ("drained", False), ("completing", False),
    ("down", True), ("down*", True), ("idle*", True), ("allocated*", True), ("fail", True), ("unknown", True),
])
def test_a_node_is_gone_when_slurm_shows_it_down_or_not_responding(state: str, gone: bool) -> None:
    assert slurm_recovery._is_gone(state) is gone


def _attempt(number: int, why: str, lost: list[str] | None = None) -> Attempt:
    return Attempt(number=number, at=float(number), nodes=["n1", "n2"], why=why, lost=lost or [])


def test_restarts_and_recoveries_are_counted_apart() -> None:
    attempts = [_attempt(1, "first start"), _attempt(2, "restart 1 of 2: rank 1 failed"),
                _attempt(3, "recovery 1: n2 lost", ["n2"]), _attempt(4, "requeued by Slurm")]
    assert (slurm_recovery.restarts(attempts), slurm_recovery.recoveries(attempts)) == (1, 1)


def test_the_next_start_takes_the_requeues_reason_once(tmp_path: Path) -> None:
    rd = run_dir(str(tmp_path / "runs" / "p" / "r"))
    rd.make()
    previous = RunRecord(project="p", experiment="e", run="r", node="n1", node_rank=0, nnodes=2, nproc=1,
                         attempts=[_attempt(1, "first start")])
    first = slurm_recovery.begin(rd, None, ["n1", "n2"], 0)
    assert (first.number, first.why, first.lost) == (1, "first start", [])
    slurm_recovery.note(rd, "recovery 1: n2 lost", ["n2"])
    again = slurm_recovery.begin(rd, previous, ["n1", "n3"], 1)
    assert (again.number, again.why, again.lost, again.nodes) == (2, "recovery 1: n2 lost", ["n2"], ["n1", "n3"])
    assert not (rd.path / slurm_recovery.REQUEUE_NOTE).exists()   # taken: a later start does not see it again


def test_status_shows_a_slurm_recovery_as_the_nodes_backend_does() -> None:
    record = RunRecord(project="p", experiment="e", run="r", node="n1", node_rank=0, nnodes=2, nproc=2,
                       state="running", created_at=1.0, started_at=2.0, lost=["n2"],
                       attempts=[_attempt(1, "first start"), _attempt(2, "recovery 1: n2 lost", ["n2"])])
    st = merge(SlurmJob("4", project="p", run="r"), Job("4", "RUNNING", None, None, ("n1", "n3")),
               json.loads(json.dumps(encode(record))))
    out = status_json(st)
    assert [a["number"] for a in out["attempts"]] == [1, 2] and out["lost"] == ["n2"]
    assert [(r["number"], r["lost"], r["why"]) for r in out["recoveries"]] == [(2, ["n2"], "recovery 1: n2 lost")]
    assert list(st.nodes) == ["n1", "n3"]

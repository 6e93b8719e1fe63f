"""A Slurm run's status merge (higgsfield.control.backends.slurm.runstatus): the job's ``run.json`` decoded once
into the contract's typed record, whatever the node side wrote; one that does not decode counts as none. No
cluster is contacted."""

from __future__ import annotations

import json
from typing import Any

import pytest

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.nodepart import NodePart
from higgsfield.contract.noderuns import NodeRunView
from higgsfield.contract.runstatus import status_json
from higgsfield.contract.slurmjob import SlurmJob
from higgsfield.control.backends.slurm.parse import Job
from higgsfield.control.backends.slurm.runstatus import merge
from higgsfield.node.state.records import RunRecord

pytestmark = pytest.mark.timeout(30)

DIAGNOSIS = {"groups": [{"ranks": ["n1/0"], "where": "all_reduce at t.py:3", "frames": []}], "odd": ["n1/1"],
             "summary": "n1/1 is at x.py:3"}


def _record(**changes: Any) -> dict[str, Any]:
    """What the job's Slurm task writes (its own RunRecord), as the login node's ``cat`` brings it back."""
    rec = RunRecord(project="p", experiment="e", run="r", node="n1", node_rank=0, nnodes=2, nproc=2,
                    state="running", created_at=1.5, started_at=2.0, command=["torchrun"], pids={"torchrun": 9})
    return {**json.loads(json.dumps(encode(rec))), **changes}


def test_the_record_the_node_writes_decodes_and_fills_what_slurm_does_not_know() -> None:
    record = _record(state="failed", reason="rank 1: boom", failed_node="n2", failed_rank=1,
                     error_tail=["Traceback", "boom"], exit_code=1, ended_at=7.0, stall=DIAGNOSIS, stalled_at=6.0)
    st = merge(SlurmJob("4"), None, record)   # the job long purged: the record speaks
    assert (st.project, st.experiment, st.run, st.state, st.reason) == ("p", "e", "r", "failed", "rank 1: boom")
    assert (st.failed_node, st.failed_rank, st.error_tail) == ("n2", 1, ["Traceback", "boom"])
    assert (st.created_at, st.started_at, st.ended_at, st.exit_code) == (1.5, 2.0, 7.0, 1)
    assert st.nodes == {"n1": NodePart("failed")}      # a scheduler's node: its state, nothing else known
    assert st.stall is not None and encode(st.stall) == DIAGNOSIS
    assert status_json(st)["node_states"] == {"n1": "failed"} and status_json(st)["stall"] == DIAGNOSIS
    assert merge(SlurmJob("4"), None, decode(NodeRunView, record)) == st   # decoded already: the same


def test_slurm_decides_the_state_and_the_record_adds_why() -> None:
    running = merge(SlurmJob("4"), Job("4", "RUNNING", nodes=("n1", "n2")), _record(state="stalled",
                                                                                    reason="stalled: x"))
    assert (running.state, running.reason, list(running.nodes)) == ("stalled", "stalled: x", ["n1", "n2"])
    requeued = merge(SlurmJob("4"), Job("4", "PENDING", "BeginTime"), _record(state="queued", reason="requeued"))
    assert requeued.state == "queued" and requeued.reason is not None and requeued.reason.startswith("requeued; ")
    killed = merge(SlurmJob("4"), None, _record(state="killed", reason="killed (scancel)"))
    assert (killed.state, killed.reason) == ("killed", "killed (scancel)")


@pytest.mark.parametrize("damage", [
    {"state": "bogus"}, {"run": "../x"}, {"created_at": "yesterday"}, {"error_tail": {"a": 1}},
    {"stall": {"odd": 3}}, {"node": None},
], ids=["state", "run", "created_at", "error_tail", "stall", "node"])
def test_a_record_that_does_not_decode_counts_as_none(damage: dict[str, Any]) -> None:
    """As a run.json that is not JSON: Slurm's state stands (the job purged: queued), nothing of the record shows."""
    record = _record(**{"state": "failed", "reason": "from the record", **damage})
    assert merge(SlurmJob("4"), Job("4", "RUNNING", nodes=("n1",)), record) == \
        merge(SlurmJob("4"), Job("4", "RUNNING", nodes=("n1",)), None)
    gone = merge(SlurmJob("4"), None, record)
    assert (gone.state, gone.reason, gone.nodes, gone.stall) == ("queued", None, {}, None)

"""A run's per-node parts and its stall, typed (higgsfield.contract.nodepart, RunStatus.nodes / .stall): what the
SSH nodes' merge makes of each node's record, and ``status --json``'s exact JSON of them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.nodepart import NodePart, stall_of
from higgsfield.contract.noderuns import NodeRunView
from higgsfield.contract.runstatus import RunStatus, RunStatusJson, status_json
from higgsfield.contract.stacks import Diagnosis
from higgsfield.control.backends.nodes.status import merge
from higgsfield.control.backends.stall import diagnosis_of, stall_fields

pytestmark = pytest.mark.timeout(30)

DIAGNOSIS = {"groups": [{"ranks": ["a/0", "b/0"], "where": "all_reduce at train.py:88",
                         "frames": [{"function": "all_reduce", "file": "train.py", "line": 88, "code": "x()"}]},
                        {"ranks": ["b/1"], "where": "data.py:17", "frames": []}],
             "odd": ["b/1"], "summary": "a/0, b/0 wait in all_reduce at train.py:88; b/1 is at data.py:17"}


def _rec(node: str, rank: int, **kw: Any) -> dict[str, Any]:
    return {"project": "p", "experiment": "e", "run": "e-1", "node": node, "node_rank": rank, "nnodes": 2,
            "nproc": 2, "state": "running", "slots": [rank], "created_at": 1.0, "started_at": 2.0,
            "command": ["torchrun"], "pids": {"supervisor": 7}, "params": {"lr": 0.1}, **kw}


def test_the_merge_keeps_each_nodes_part_typed_and_status_json_is_unchanged() -> None:
    recs = [_rec("b", 1, state="stalled", stall=DIAGNOSIS, stalled_at=9.0, exclusive=True),
            _rec("a", 0, state="stalled", stall=DIAGNOSIS, stalled_at=8.5, reason="stalled: x")]
    (st,) = merge([decode(NodeRunView, r) for r in recs])
    assert list(st.nodes) == ["a", "b"]
    a = st.nodes["a"]
    assert (a.state, a.slots, a.nproc, a.exclusive, a.reason, a.started_at) == ("stalled", (0,), 2, False,
                                                                              "stalled: x", 2.0)
    assert a.stall is not None and a.stall.odd == ("b/1",) and st.nodes["b"].stalled_at == 9.0
    assert diagnosis_of(st) == decode(Diagnosis, DIAGNOSIS)
    assert stall_fields(st) == {"stall": DIAGNOSIS, "stalled_at": 8.5}
    d = json.loads(json.dumps({**status_json(st), **stall_fields(st)}))
    d.pop("duration")
    assert d == {"version": 1, "project": "p", "experiment": "e", "run": "e-1", "state": "stalled",
                 "nodes": ["a", "b"], "created_at": 1.0, "started_at": 2.0, "ended_at": None, "exit_code": None,
                 "failed_node": None, "failed_rank": None, "reason": None, "error_tail": [], "params": {"lr": 0.1},
                 "stall": DIAGNOSIS, "node_states": {"a": "stalled", "b": "stalled"}, "stalled_at": 8.5,
                 "stragglers": [], "attempts": [], "recoveries": [], "lost": []}


def test_a_scheduler_knows_only_the_state_and_the_json_reads_back() -> None:
    st = RunStatus("p", "e", "e-1", "failed", {"n1": NodePart("failed"), "n2": NodePart("killed")}, 1.0, 2.0, 5.0,
                   stall=decode(Diagnosis, DIAGNOSIS))
    d = json.loads(json.dumps(status_json(st)))
    assert d["stall"] == DIAGNOSIS and d["node_states"] == {"n1": "failed", "n2": "killed"}
    again = decode(RunStatusJson, d)
    assert again == RunStatusJson.of(st) and encode(again) == d
    with pytest.raises(DecodeError, match="'stall.groups' is missing"):   # the JSON read back is checked
        decode(RunStatusJson, {**d, "stall": {"odd": 3}})
    # the nodes know only their state: the views fall back to the run's own diagnosis (a Slurm job's)
    assert stall_fields(st) == {"stall": DIAGNOSIS, "stalled_at": None}


@pytest.mark.parametrize("v", [None, {"odd": 3}, [], "stalled", {"groups": [{"ranks": [1]}], "odd": [], "summary": ""}])
def test_a_stall_that_does_not_decode_is_none(v: object) -> None:
    assert stall_of(v) is None
    assert stall_of(DIAGNOSIS) == decode(Diagnosis, DIAGNOSIS)

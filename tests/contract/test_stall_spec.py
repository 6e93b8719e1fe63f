"""The stall settings of a RunSpec, and the ``stalled`` state (higgsfield.contract.runspec)."""

from __future__ import annotations

import json

import pytest

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.noderuns import NodeRunView
from higgsfield.contract.runspec import ON_STALL, RunSpec, SpecError, read_spec
from higgsfield.contract.stacks import Diagnosis
from higgsfield.contract.states import ACTIVE, STALLED, STATES

pytestmark = pytest.mark.timeout(30)


def _spec(**changes: object) -> RunSpec:
    return RunSpec(project="demo", experiment="e", run="e-1", module="train", code_dir="/c", params={},
                   node="n0", node_rank=0, nodes=("n0",), master_addr="127.0.0.2",
                   submitted_at=1.0).replace(**changes)


def test_stall_settings_round_trip_and_defaults_are_not_sent() -> None:
    spec = _spec(stall_timeout=30.0, startup_timeout=120.0, on_stall="wait")
    assert read_spec(json.loads(json.dumps(encode(spec)))) == spec
    d = encode(_spec())
    assert not {"stall_timeout", "startup_timeout", "on_stall"} & set(d)   # an older node reads it
    back = read_spec(d)
    assert (back.stall_timeout, back.startup_timeout, back.on_stall) == (600.0, 1800.0, "fail")
    assert ON_STALL == ("fail", "restart", "wait")


@pytest.mark.parametrize(("key", "value"), [("stall_timeout", -1), ("stall_timeout", "10"),
                                            ("startup_timeout", float("inf")), ("on_stall", "retry")])
def test_bad_stall_settings_are_one_line(key: str, value: object) -> None:
    d = encode(_spec())
    d[key] = value
    with pytest.raises(SpecError, match=key):
        read_spec(d)


def test_stalled_is_an_active_state_a_view_carries_with_its_diagnosis() -> None:
    assert STALLED in STATES and STALLED in ACTIVE
    diag = {"groups": [{"ranks": ["n0/0"], "where": "at a.py:1", "frames": []}], "odd": [], "summary": "n0/0 is at a.py:1"}
    v = decode(NodeRunView, {"project": "demo", "experiment": "e", "run": "e-1", "node": "n0", "node_rank": 0,
                             "state": STALLED, "created_at": 1.0, "stall": diag, "stalled_at": 5.0})
    assert v.stall == decode(Diagnosis, diag) and v.stalled_at == 5.0 and encode(v)["stall"] == diag

"""The typed run contract: a spec survives the wire unchanged, and a node refuses what it cannot read.

    pytest tests/contract/test_runspec.py
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.nodepart import NodePart
from higgsfield.contract.runspec import (
    SPEC_VERSION,
    Coordinator,
    Handoff,
    RunSpec,
    SpecError,
    StartRequest,
    read_request,
    read_spec,
)
from higgsfield.contract.runstatus import RunStatus, RunStatusJson, status_json
from higgsfield.contract.states import ACTIVE, STATES, TERMINAL

pytestmark = pytest.mark.timeout(60)


def _spec(**changes: object) -> RunSpec:
    base = RunSpec(project="demo", experiment="tiny_llama", run="tiny_llama-20261201-1", module="train",
                   code_dir="~/.hfrt/projects/demo/code", params={"steps": 5, "lr": 0.1, "name": "x"},
                   node="gpu1", node_rank=1, nodes=("gpu0", "gpu1"), master_addr="10.0.0.2",
                   submitted_at=1796000000.5, nproc=2, coordinator=Coordinator("10.0.0.2", 29400, "gpu0"),
                   max_restarts=1, runtime="docker", exclusive=True)
    return base.replace(**changes)


def test_a_spec_crosses_the_wire_unchanged() -> None:
    spec = _spec()
    wire = json.loads(json.dumps(encode(spec)))
    again = read_spec(wire)
    assert again == spec and again.nnodes == 2 and wire["version"] == SPEC_VERSION
    assert isinstance(again.coordinator, Coordinator) and again.coordinator.port == 29400
    node0 = _spec(node="gpu0", node_rank=0, coordinator=None, nproc=None)
    assert read_spec(encode(node0)) == node0


def test_the_wire_keeps_its_keys_and_their_order() -> None:
    """The JSON an older node reads: the fields in their order, the version last, the optional ones left out."""
    assert list(encode(_spec())) == [
        "project", "experiment", "run", "module", "code_dir", "params", "node", "node_rank", "nodes",
        "master_addr", "submitted_at", "nproc", "coordinator", "max_restarts", "runtime", "exclusive", "src_dir",
        "version"]
    assert encode(_spec(attempt="ab12", checkpoint_mirror="s3://b/x"))["attempt"] == "ab12"


@pytest.mark.parametrize("version,words", [
    (SPEC_VERSION + 1, "upgrade them with 'higgsfield setup'"),
    (0, "this higgsfield is older than the nodes'"),
    (None, "this higgsfield is older than the nodes'"),
    ("1", "this higgsfield is older than the nodes'"),
])
def test_a_node_refuses_a_spec_of_another_version_saying_which_side_to_upgrade(version: object, words: str) -> None:
    d = encode(_spec())
    d["version"] = version
    with pytest.raises(SpecError, match=f"run spec version {version!r} is not the version") as e:
        read_spec(d)
    assert words in str(e.value) and e.value.exit_code == 2


@pytest.mark.parametrize("key,value,words", [
    ("run", "../../etc", "is not a run name"),
    ("run", "a\n", "is not a run name"),
    ("project", "a/b", "run spec: 'project' 'a/b' is not a name"),
    ("module", "os.path;x", "is not a name"),
    ("src_dir", "../elsewhere", "'src_dir' must be a path inside the project"),
    ("node_rank", -1, "'node_rank' must be an integer >= 0"),
    ("node_rank", True, "'node_rank' must be an integer"),
    ("node_rank", 0, "run spec: node 'gpu1' is not number 0 of its nodes"),
    ("nproc", 0, "'nproc' must be an integer >= 1"),
    ("runtime", "podman", "'runtime' must be one of auto, docker, process"),
    ("submitted_at", float("nan"), "'submitted_at' must be a number"),
    ("params", [1], "'params' must be an object"),
    ("coordinator", {"host": "h", "port": 70000, "node": "gpu0"}, "'coordinator.port' must be a TCP port"),
    ("node", "bad name", "node name 'bad name' is not valid"),
    ("attempt", "a-b", "'attempt' must be a token of at most 64 letters and digits"),
    ("code_dir", "", "'code_dir' must be a non-empty string"),
    ("checkpoint_dir", "/x", "run spec field(s) 'checkpoint_dir' unknown to this node's higgsfield: upgrade the "
                             "nodes with 'higgsfield setup'"),
])
def test_a_malformed_field_is_refused_naming_it(key: str, value: object, words: str) -> None:
    d = encode(_spec())
    d[key] = value
    with pytest.raises(SpecError) as e:
        read_spec(d)
    assert words in str(e.value) and str(e.value).startswith("run spec"), str(e.value)


def test_a_missing_field_is_named() -> None:
    d = encode(_spec())
    del d["master_addr"]
    with pytest.raises(SpecError, match="'master_addr' is missing"):
        read_spec(d)
    with pytest.raises(SpecError, match="not a JSON object"):
        read_spec([d])
    del d["params"]     # none: no params (the control side always sends them)
    d["master_addr"] = "h"
    assert read_spec(d).params == {}


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["version", "project", "run", "nodes", "node", "node_rank", "params",
                                        "coordinator", "nproc", "zz"]),
                       st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c,
                                                                                      max_size=3),
                                    max_leaves=6)))
def test_any_json_either_parses_or_raises_a_spec_error(patch: dict[str, object]) -> None:
    d = {**encode(_spec()), **patch}
    try:
        spec = read_spec(d)
    except SpecError:
        return
    assert read_spec(encode(spec)) == spec


def test_the_start_request_is_one_type_encoded_once_and_read_once() -> None:
    req = StartRequest(_spec(), secrets={"HF_TOKEN": "s3cr3t"}, token="t" * 64)
    wire = json.loads(json.dumps(encode(req)))
    assert list(wire) == ["spec", "secrets", "token"] and "s3cr3t" not in repr(req)
    assert read_request(wire) == req
    assert read_request({"spec": wire["spec"]}) == StartRequest(_spec())     # no secrets, no token: empty
    with pytest.raises(SpecError, match=r"the run request: 'secrets\.A' must be a string, not a number"):
        read_request({**wire, "secrets": {"A": 1}})
    with pytest.raises(SpecError, match="the run request on stdin is not a JSON object"):
        read_request([wire])
    with pytest.raises(SpecError, match="run spec version 9"):   # the spec's own error, unchanged
        read_request({**wire, "spec": {**wire["spec"], "version": 9}})


def test_the_supervisors_handoff_is_the_request_less_its_spec() -> None:
    req = StartRequest(_spec(), secrets={"HF_TOKEN": "s3cr3t"}, token="t" * 64)
    wire = json.loads(json.dumps(encode(req.handoff)))
    assert wire == {"secrets": {"HF_TOKEN": "s3cr3t"}, "token": "t" * 64} and "s3cr3t" not in repr(req.handoff)
    assert decode(Handoff, wire) == Handoff({"HF_TOKEN": "s3cr3t"}, "t" * 64)
    assert decode(Handoff, {}) == decode(Handoff, {"secrets": None, "token": None}) == Handoff()   # empty stdin


def test_states_are_one_vocabulary_and_status_json_round_trips() -> None:
    assert set(STATES) == ACTIVE | TERMINAL and not ACTIVE & TERMINAL
    st_ = RunStatus(project="demo", experiment="e", run="r", state="failed",
                    nodes={"gpu0": NodePart("failed"), "gpu1": NodePart("killed")}, created_at=1.0,
                    started_at=2.0, ended_at=5.0, exit_code=1, failed_node="gpu1", failed_rank=3,
                    reason="rank 3 exited 1", error_tail=["boom"])
    d = json.loads(json.dumps(status_json(st_)))
    assert list(d) == ["version", "project", "experiment", "run", "state", "nodes", "created_at", "started_at",
                       "ended_at", "duration", "exit_code", "failed_node", "failed_rank", "reason", "error_tail",
                       "params", "stall", "node_states", "stragglers", "attempts", "recoveries", "lost"]
    assert d["version"] == 1 and d["duration"] == 3.0 and d["node_states"] == {"gpu0": "failed", "gpu1": "killed"}
    again = decode(RunStatusJson, d)
    assert encode(again) == d and again == RunStatusJson.of(st_) and not st_.active

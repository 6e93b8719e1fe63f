"""The typed run contract: a spec survives the wire unchanged, and a node refuses what it cannot read.

    pytest tests/contract/test_runspec.py
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from higgsfield.contract.nodepart import NodePart
from higgsfield.contract.runspec import (
    ACTIVE,
    SPEC_VERSION,
    STATES,
    TERMINAL,
    Coordinator,
    RunSpec,
    RunStatus,
    SpecError,
)

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
    again = RunSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec and again.nnodes == 2 and again.version == SPEC_VERSION
    assert isinstance(again.coordinator, Coordinator) and again.coordinator.port == 29400
    node0 = _spec(node="gpu0", node_rank=0, coordinator=None, nproc=None)
    assert RunSpec.from_dict(node0.to_dict()) == node0


@pytest.mark.parametrize("version,words", [
    (SPEC_VERSION + 1, "upgrade them with 'higgsfield setup'"),
    (0, "this higgsfield is older than the nodes'"),
    (None, "this higgsfield is older than the nodes'"),
    ("1", "this higgsfield is older than the nodes'"),
])
def test_a_node_refuses_a_spec_of_another_version_saying_which_side_to_upgrade(version: object, words: str) -> None:
    d = _spec().to_dict()
    d["version"] = version
    with pytest.raises(SpecError, match=f"run spec version {version!r} is not the version") as e:
        RunSpec.from_dict(d)
    assert words in str(e.value) and e.value.exit_code == 2


@pytest.mark.parametrize("key,value,words", [
    ("run", "../../etc", "is not a run name"),
    ("run", "a\n", "is not a run name"),
    ("project", "a/b", "'project' 'a/b' is not a name"),
    ("module", "os.path;x", "is not a name"),
    ("src_dir", "../elsewhere", "'src_dir' must be a path inside the project"),
    ("node_rank", -1, "'node_rank' must be an integer >= 0"),
    ("node_rank", True, "'node_rank' must be an integer"),
    ("node_rank", 0, "node 'gpu1' is not number 0 of its nodes"),
    ("nproc", 0, "'nproc' must be an integer >= 1"),
    ("runtime", "podman", "'runtime' must be one of auto, docker, process"),
    ("submitted_at", float("nan"), "'submitted_at' must be a number"),
    ("params", [1], "'params' must be an object"),
    ("coordinator", {"host": "h", "port": 70000, "node": "gpu0"}, "TCP port"),
    ("node", "bad name", "node name 'bad name' is not valid"),
    ("checkpoint_dir", "/x", "field(s) 'checkpoint_dir' unknown to this node"),
])
def test_a_malformed_field_is_refused_naming_it(key: str, value: object, words: str) -> None:
    d = _spec().to_dict()
    d[key] = value
    with pytest.raises(SpecError) as e:
        RunSpec.from_dict(d)
    assert words in str(e.value)


def test_a_missing_field_is_named() -> None:
    d = _spec().to_dict()
    del d["master_addr"]
    with pytest.raises(SpecError, match="'master_addr' is missing"):
        RunSpec.from_dict(d)
    with pytest.raises(SpecError, match="not a JSON object"):
        RunSpec.from_dict([d])


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["version", "project", "run", "nodes", "node", "node_rank", "params",
                                        "coordinator", "nproc", "zz"]),
                       st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c,
                                                                                      max_size=3),
                                    max_leaves=6)))
def test_any_json_either_parses_or_raises_a_spec_error(patch: dict[str, object]) -> None:
    d = {**_spec().to_dict(), **patch}
    try:
        spec = RunSpec.from_dict(d)
    except SpecError:
        return
    assert RunSpec.from_dict(spec.to_dict()) == spec


def test_states_are_one_vocabulary_and_status_json_round_trips() -> None:
    assert set(STATES) == ACTIVE | TERMINAL and not ACTIVE & TERMINAL
    st_ = RunStatus(project="demo", experiment="e", run="r", state="failed",
                    nodes={"gpu0": NodePart("failed"), "gpu1": NodePart("killed")}, created_at=1.0,
                    started_at=2.0, ended_at=5.0, exit_code=1, failed_node="gpu1", failed_rank=3,
                    reason="rank 3 exited 1", error_tail=["boom"])
    d = json.loads(json.dumps(st_.to_dict()))
    assert d["version"] == 1 and d["duration"] == 3.0 and d["node_states"] == {"gpu0": "failed", "gpu1": "killed"}
    again = RunStatus.from_dict(d)
    assert again.to_dict() == d and not again.active

"""The drift comparison (higgsfield.contract.drift): pure, no node needed."""

from __future__ import annotations

import pytest

from higgsfield.contract.codec import DecodeError, decode, encode
from higgsfield.contract.drift import (
    Difference,
    DriftReport,
    NodeFacts,
    NodesDrift,
    compare,
    drifted,
    report_json,
)

pytestmark = pytest.mark.timeout(10)


def _facts(node: str, **kw: object) -> NodeFacts:
    base: dict[str, object] = {"runtime": "process", "torch": "2.13.0", "python": "3.11.2", "invoker": "0.1.0",
                               "env_key": "abc-py311", "packages": {"numpy": "2.1.0", "torch": "2.13.0"}}
    return NodeFacts(node=node, **{**base, **kw})  # type: ignore[arg-type]


def test_identical_nodes_have_no_difference() -> None:
    assert compare([_facts("n1"), _facts("n2"), _facts("n3")]) == []


def test_the_odd_node_is_named_with_its_value_and_the_majoritys() -> None:
    diffs = compare([_facts("n1"), _facts("n2", packages={"numpy": "1.26.4", "torch": "2.13.0"}), _facts("n3")])
    assert diffs == [Difference("package numpy", "n2", "1.26.4", "2.1.0", 2)]
    assert diffs[0].line() == "n2: numpy 1.26.4 (the other 2 nodes: 2.1.0)"


def test_scalars_come_first_and_a_missing_package_or_driver_is_none() -> None:
    a = _facts("n1", driver="550.54", gpu_count=8)
    b = _facts("n2", driver="550.54", gpu_count=8)
    c = _facts("n3", driver=None, gpu_count=7, packages={"torch": "2.13.0"})
    lines = [d.line() for d in compare([a, b, c])]
    assert lines == ["n3: NVIDIA driver none (the other 2 nodes: 550.54)",
                     "n3: GPU count 7 (the other 2 nodes: 8)",
                     "n3: numpy none (the other 2 nodes: 2.1.0)"]


def test_a_tie_goes_to_node_0_and_unknown_packages_are_not_compared() -> None:
    diffs = compare([_facts("n1", env_key="k1"), _facts("n2", env_key="k2")])
    assert [(d.node, d.value, d.majority) for d in diffs] == [("n2", "k2", "k1")]
    # an image's packages are not listed: nothing to compare them with
    assert compare([_facts("n1"), _facts("n2", packages=None)]) == []


def test_refusal_is_one_line_with_exit_2_and_the_reasons_per_node() -> None:
    diffs = compare([_facts("n1"), _facts("n2"), _facts("n3", python="3.12.1", torch="2.6.0")])
    err = NodesDrift(diffs)
    assert err.exit_code == 2 and "\n" not in str(err)
    assert "n3: Python 3.12.1 (the other 2 nodes: 3.11.2)" in str(err) and "--allow-drift" in str(err)
    assert drifted(diffs) == {"n3": "drifted: torch 2.6.0 (others: 2.13.0), Python 3.12.1 (others: 3.11.2)"}


def test_facts_cross_the_wire_and_a_bad_reply_is_one_line() -> None:
    f = _facts("n1", gpu_model="NVIDIA H100 80GB HBM3", gpu_count=8)
    assert decode(NodeFacts, encode(f)) == f
    with pytest.raises(DecodeError, match="packages"):
        decode(NodeFacts, {**encode(f), "packages": {"numpy": 2}})
    report = report_json(DriftReport.of([f, _facts("n2", gpu_count=8)], {"n3": "timed out"}))
    assert set(report) == {"nodes", "differences", "unreachable"}
    assert report["differences"] == [{"field": "gpu_model", "node": "n2", "value": "none",
                                      "majority": "NVIDIA H100 80GB HBM3", "nodes": 1}]
    assert report["unreachable"] == {"n3": "timed out"} and "version" not in report["nodes"][0]

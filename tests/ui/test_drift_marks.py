"""The Nodes view's drift marks (higgsfield.control.backends.nodes.fleet_drift): what a card carries."""

from __future__ import annotations

import pytest

from higgsfield.contract.drift import DriftReport, NodeFacts
from higgsfield.control.backends.nodes.fleet_drift import DriftWatch

pytestmark = pytest.mark.timeout(10)


def test_a_drifted_node_carries_its_differences_and_the_others_none() -> None:
    watch = DriftWatch(None, lambda: [], lambda: None)  # type: ignore[arg-type]
    assert watch.marks("n1") == []    # nothing asked yet: no mark
    same = {"torch": "2.13.0", "packages": {"numpy": "2.1.0"}}
    watch.report = DriftReport.of([NodeFacts(node="n1", **same), NodeFacts(node="n2", **same),  # type: ignore[arg-type]
                                   NodeFacts(node="n3", torch="2.6.0", packages={"numpy": "1.26.4"})])
    assert watch.marks("n3") == ["torch 2.6.0 (the other 2 nodes: 2.13.0)", "numpy 1.26.4 (the other 2 nodes: 2.1.0)"]
    assert watch.marks("n1") == []

"""The doctor's drift check: the nodes compared with each other (what ``run`` refuses to start on).

Each node answers ``invoker facts`` (:mod:`higgsfield.control.backends.nodes.drift`), the
answers are compared (:func:`higgsfield.contract.drift.compare`), and every difference
becomes one problem line of the node that differs, with its value and the majority's::

    ✗ n2: drift numpy: 1.26.4 (the other 2 nodes: 2.1.0) -> fix: ...

Its own module because it is the one check that needs every node's answer at once.
``doctor --json`` carries the whole :class:`~higgsfield.contract.drift.DriftReport` under ``drift``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from higgsfield.contract.codec import encode
from higgsfield.contract.drift import DriftReport
from higgsfield.control.backends.nodes.drift import drift_report
from higgsfield.control.doctor.report import CheckName, NodeDiagnosis, Probe

if TYPE_CHECKING:
    from higgsfield.control.config import Config
    from higgsfield.control.remote import Group

FIX = ("make the node match the others (redeploy: 'higgsfield deploy'; or undo what was installed by hand), "
       "or leave it out of runs with 'higgsfield run --exclude NODE'")


async def check_drift(cfg: Config, up: Group, diags: dict[str, NodeDiagnosis]) -> DriftReport | None:
    """Compare the reachable nodes; record a ``drift`` check on each (None: fewer than two nodes to compare)."""
    if len(up.members) < 2:
        return None
    report = await drift_report(up, cfg)
    for f in report.nodes:
        diags[f.node].checks[CheckName.DRIFT] = Probe(True, "same")
    for node, why in report.unreachable.items():
        diags[node].checks[CheckName.DRIFT] = Probe(False, "unknown", f"its facts could not be read: {why}",
                                            "higgsfield setup (an older invoker has no 'facts')")
    by_node: dict[str, int] = {}
    for d in report.differences:
        by_node[d.node] = by_node.get(d.node, 0) + 1
        diags[d.node].checks[f"drift {d.label}"] = Probe(False, "differs", d.against(),
                                                          FIX, data=encode(d))
    for node, n in by_node.items():
        diags[node].checks[CheckName.DRIFT] = Probe(False, f"{n} differ", data={"differences": n})
    return report

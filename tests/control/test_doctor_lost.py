"""``doctor`` lists the nodes active runs lost (their survivors' records say so), and whether each is healthy now."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from higgsfield.contract.noderuns import AttemptView
from higgsfield.contract.runstatus import RunStatus
from higgsfield.control.cli._doctor_table import render_lost
from higgsfield.control.doctor.lost import LostNode, lost_nodes
from higgsfield.control.doctor.report import DoctorReport, NodeDiagnosis, Probe

pytestmark = pytest.mark.timeout(30)


def _run(name: str, state: str, *attempts: AttemptView) -> RunStatus:
    return RunStatus(project="p", experiment="e", run=name, state=state, nodes={}, created_at=1.0,
                     attempts=list(attempts), lost=[n for a in attempts for n in a.lost])


def test_the_nodes_active_runs_lost_are_listed_with_their_health_now() -> None:
    first = AttemptView(1, 10.0, ["n0", "n1", "n2"], "first start")
    runs = [
        _run("going", "running", first, AttemptView(2, 50.0, ["n1", "n2"], "recovery 1: n0 lost", ["n0"]),
             AttemptView(3, 90.0, ["n1"], "recovery 2: n2 lost", ["n2"])),
        _run("ended", "succeeded", first, AttemptView(2, 20.0, ["n0", "n1"], "recovery 1: n2 lost", ["n2"])),
        _run("whole", "running", first),
    ]
    report = DoctorReport([NodeDiagnosis("n0", 0, {"ssh": Probe(True, "ok")}),
                           NodeDiagnosis("n2", 2, {"ssh": Probe(False, "refused", "connection refused")})])
    lost = lost_nodes(runs, report)
    assert lost == [LostNode("n0", "going", 50.0, True), LostNode("n2", "going", 90.0, False)]
    assert lost_nodes(runs, DoctorReport([]))[0].healthy is None   # not checked this time
    out = io.StringIO()
    render_lost(Console(file=out, width=200, color_system=None), lost)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("! n0: lost by run going at ") and lines[0].endswith("healthy now: new runs may use it")
    assert lines[1].endswith("still failing its checks (above)")

"""The Nodes view's fabric marks: the last fabric test's figures per node and the slow node marked.

Unit-level, on the data the page gets: the node reads the result line its fabric run left in
``rank0.log`` (real files in a real state dir, through the real ``invoker fabric-last`` verb),
the reply decodes once, the dashboard keeps the newest and marks the outlier by the shared rule.
The browser check of the same marks shares the bed's slowed-node preflight run
(tests/provision/test_doctor_fabric.py, through tests/ui/fabric_page.py).
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.fabric import MARKER, FabricResult, GpuRow, NodeRow, PairRow, SizeRow, outliers
from higgsfield.contract.fabric_last import LastFabric, newest, node_marks
from higgsfield.control.backends.nodes.fleet_fabric import FabricWatch
from higgsfield.node.cli import invoker
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import RunDir, RunRecord

pytestmark = pytest.mark.timeout(20)

NODES = ["n1", "n2", "n3"]


def _result(slow: str | None = "n3", gpu_health: str = "ok") -> FabricResult:
    """Three nodes; every pair with ``slow`` in it at 1/10 of the others (its best link too, so it is the outlier)."""
    pairs = [PairRow(a, b, 4 << 20, 100.0, 0.06 if slow in (a, b) else 0.6)
             for a, b in (("n1", "n2"), ("n1", "n3"), ("n2", "n3"))]
    per_node = [NodeRow(n, 1, None, None if n != "n1" else 0.6, 400.0 + i, "/ckpt",
                        None if n != "n2" else [GpuRow(0, "H100", 80000.0, 81559.0, gpu_health)])
                for i, n in enumerate(NODES)]
    return FabricResult(backend="gloo", nodes=NODES, world_size=3,
                        allreduce=[SizeRow(8, 2, 500.0, 1.6e-5, 2.1e-5)], pairs=pairs, per_node=per_node)


def _fabric_run(state: Path, run: str, log: str, at: float, project: str = "p") -> None:
    rd = RunDir(NodeState(state), project, run)
    rd.make()
    rd.write(RunRecord(project=project, experiment="higgsfield_fabric", run=run, node="n1", node_rank=0,
                       nnodes=3, nproc=1, state="succeeded"))
    rd.logs.mkdir(parents=True, exist_ok=True)
    rd.rank_log(0).write_text(log)
    os.utime(rd.rank_log(0), (at, at))


def _ask(state: Path, project: str = "p") -> LastFabric:
    r = CliRunner().invoke(invoker, ["--state-dir", str(state), "fabric-last", "--project", project])
    assert r.exit_code == 0, r.output
    return decode(LastFabric, json.loads(r.output))


def test_the_node_answers_its_newest_readable_result_and_nothing_when_none(tmp_path: Path) -> None:
    assert _ask(tmp_path) == LastFabric()                   # no test ever: an empty reply, not an error
    line = MARKER + json.dumps(encode(_result()))
    _fabric_run(tmp_path, "fabric-20261204-100000-aaaa", f"warm-up\n{line}\nbye\n", 1000.0)
    _fabric_run(tmp_path, "fabric-20261204-110000-bbbb", f"{MARKER}{{\"version\": 1, \"nod\n", 2000.0)  # cut short
    _fabric_run(tmp_path, "train-1", f"{line}\n", 3000.0)   # not a fabric test: its lines are no result
    _fabric_run(tmp_path, "fabric-20261204-120000-cccc", f"{line}\n", 4000.0, project="other")
    last = _ask(tmp_path)
    assert last.run == "fabric-20261204-100000-aaaa" and last.at == 1000.0
    assert last.result is not None and last.result.nodes == NODES
    assert [o.node for o in last.result.outliers] == ["n3"]   # named again here by the shared rule


def test_each_node_carries_its_figures_and_the_outlier_is_marked_slow() -> None:
    marks = node_marks(LastFabric("fabric-x", 1000.0, _with_outliers(_result(gpu_health="ECC errors: 2"))))
    assert sorted(marks) == NODES
    assert marks["n3"]["slow"] is not None and marks["n3"]["slow"].startswith("n3 is slow: its best link 0.06 GB/s")
    assert marks["n1"]["slow"] is None and marks["n2"]["slow"] is None
    assert marks["n1"]["link_gbps"] == 0.6 and marks["n1"]["busbw_gbps"] == 0.6       # one rank: its best link
    assert marks["n3"]["link_gbps"] == 0.06                                            # from the pairs
    assert [marks[n]["write_mbps"] for n in NODES] == [400.0, 401.0, 402.0]
    assert (marks["n1"]["gpu"], marks["n2"]["gpu"], marks["n2"]["gpu_ok"]) == ("n/a", "gpu0: ECC errors: 2", False)
    assert all(m["at"] == 1000.0 and m["run"] == "fabric-x" for m in marks.values())
    even = node_marks(LastFabric("fabric-y", 1.0, _with_outliers(_result(slow=None))))
    assert not any(m["slow"] for m in even.values())
    assert node_marks(None) == {} and node_marks(LastFabric()) == {}


def _with_outliers(r: FabricResult) -> FabricResult:
    return replace(r, run="fabric-x", outliers=outliers(r.pairs))


@pytest.mark.parametrize("bad", [
    [], {"version": 2}, {"run": "train-1"}, {"run": "fabric-x", "at": "now"}, {"at": -1},
    {"run": "fabric-x", "at": 1.0, "result": {"version": 1, "nodes": "n1"}},
])
def test_a_bad_reply_is_one_decode_error(bad: Any) -> None:
    with pytest.raises(DecodeError):
        decode(LastFabric, bad)


def test_the_dashboard_keeps_the_newest_and_asks_again_when_a_test_ends() -> None:
    async def go() -> None:
        told: list[int] = []
        w = FabricWatch(None, lambda: [], lambda: told.append(1))  # type: ignore[arg-type]
        assert w.marks("n3") is None
        old = LastFabric("fabric-old", 1.0, _with_outliers(_result()))
        new = LastFabric("fabric-new", 2.0, _with_outliers(_result(slow=None)))
        w.take([old, None, LastFabric()])
        w.take([new, old])
        w.take([old])                      # an older answer (a node that held an older test) changes nothing
        assert w.last == new and len(told) == 2
        assert newest([old, new]) == new
        m = w.marks("n3")
        assert m is not None and m["slow"] is None
        w.seen(["fabric-new", "train-1"])  # a node's first report: asked then
        assert w._wake.is_set()
        w._wake.clear()
        w.seen(["fabric-new"])             # seen before: nothing
        assert not w._wake.is_set()
        w.seen(["fabric-newer"])           # a test just ended
        assert w._wake.is_set()
    asyncio.run(go())

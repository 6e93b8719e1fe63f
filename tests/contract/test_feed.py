"""A node's dashboard feed, typed (higgsfield.contract.feed): what ``invoker stats --follow`` prints decodes into
the contract's types, and gives the page back exactly the JSON the node printed; each part decodes on its own."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.feed import FEED_VERSION, FeedLine, GpuSample, NodeSample, QueueEntry
from higgsfield.node.gang.queue import Entry
from higgsfield.node.observe.watch import feed
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import RunDir, RunRecord

pytestmark = pytest.mark.timeout(60)

SAMPLE = NodeSample(time=12.5, cpu_percent=3.0, cpu_count=8, load1=0.5, mem_used=1 << 30, mem_total=8 << 30,
                    disk_used=5, disk_total=10, gpus=[GpuSample(0, "NVIDIA H200", 55.0, 1024.0, 141000.0, 40.0),
                                                     GpuSample(1, "NVIDIA H200", None, None, None, None)])
# what the node printed before it built the contract's types (its own dataclasses, through asdict): key for key
PRINTED = ('{"time": 12.5, "cpu_percent": 3.0, "cpu_count": 8, "load1": 0.5, "mem_used": 1073741824, '
           '"mem_total": 8589934592, "disk_used": 5, "disk_total": 10, "gpus": [{"index": 0, "name": "NVIDIA H200", '
           '"util_percent": 55.0, "mem_used_mib": 1024.0, "mem_total_mib": 141000.0, "temperature_c": 40.0}, '
           '{"index": 1, "name": "NVIDIA H200", "util_percent": null, "mem_used_mib": null, "mem_total_mib": null, '
           '"temperature_c": null}]}')


def _wire(d: dict[str, Any]) -> str:
    return json.dumps(d)


def test_what_the_node_prints_decodes_and_gives_the_same_json_back(tmp_path: Path) -> None:
    rd = RunDir(NodeState(tmp_path), "p", "r0")
    rd.make()
    rd.write(RunRecord(project="p", experiment="e", run="r0", node="n", node_rank=0, nnodes=1, nproc=1))
    printed: list[dict[str, Any]] = []
    feed(NodeState(tmp_path), every=0.05, project="p", emit=printed.append, ticks=2)   # the node's own feed, in-process
    lines = [FeedLine.parse(json.dumps(m)) for m in printed]
    samples = [(m["node"], ln.node) for m, ln in zip(printed, lines, strict=True) if ln is not None and ln.node]
    assert samples and all(json.dumps(encode(s)) == json.dumps(raw) for raw, s in samples)
    runs = next(ln for ln in lines if ln is not None and ln.runs is not None)
    assert runs.full and [v.run for v in runs.runs or []] == ["r0"] and runs.queue == []
    assert json.dumps(encode(SAMPLE)) == PRINTED                    # the node's sample: the wire of before
    with_gpus = json.loads(json.dumps(encode(SAMPLE)))
    decoded = decode(NodeSample, with_gpus)
    assert json.dumps(encode(decoded)) == json.dumps(with_gpus)     # key for key, in the node's order
    assert decoded.gpus[0] == GpuSample(0, "NVIDIA H200", 55.0, 1024.0, 141000.0, 40.0)
    assert decoded.gpus[1].util_percent is None


def test_a_queue_entry_reaches_the_page_without_pids_or_ports() -> None:
    entry = asdict(Entry(project="p", run="r-1", want=2, exclusive=True, order=1.0, pid=42, slots=[0, 1],
                         pid_start=7, committed=True, port=29500))
    e = decode(QueueEntry, entry)
    assert encode(e) == {"project": "p", "run": "r-1", "want": 2, "slots": [0, 1], "committed": True}
    assert list(encode(e)) == ["project", "run", "want", "slots", "committed"]


def test_each_part_decodes_on_its_own() -> None:
    record = encode(RunRecord(project="p", experiment="e", run="r0", node="n", node_rank=0, nnodes=1, nproc=1))
    line = FeedLine.parse(_wire({
        "node": {**encode(SAMPLE), "cpu_count": "many"},               # a sample that does not decode
        "runs": [record, {**record, "run": "../up"}, "x"], "full": True,  # one record that does
        "queue": [{"project": "p", "run": "r0", "want": 1, "slots": None, "committed": False}, {"run": 3}],
        "skipped": ["a\x1b[31m", *["x" * 700] * 200]}))
    assert line is not None and line.node is None
    assert [v.run for v in line.runs or []] == ["r0"] and line.full
    assert [q.run for q in line.queue or []] == ["r0"]
    assert line.skipped is not None and len(line.skipped) == 100 and "\x1b" not in line.skipped[0]
    assert line.skipped[1] == "x" * 600 + "… (100 more chars)"
    only = FeedLine.parse(_wire({"node": encode(SAMPLE)}))
    assert only is not None and only.node is not None and (only.runs, only.queue, only.skipped) == (None, None, None)


@pytest.mark.parametrize("raw", ["Welcome to the node!", "", "[1, 2]", "null", '"text"'])
def test_a_line_that_is_not_the_feeds_is_none(raw: str) -> None:
    assert FeedLine.parse(raw) is None


def test_another_version_is_one_line_naming_the_side_to_upgrade() -> None:
    assert FeedLine.parse(_wire({"version": FEED_VERSION, "skipped": []})) == FeedLine(skipped=[])
    with pytest.raises(DecodeError) as e:
        FeedLine.parse(_wire({"version": FEED_VERSION + 1, "node": encode(SAMPLE)}))
    assert "version 2" in str(e.value) and "upgrade higgsfield" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(("change", "needle"), [
    ({"mem_total": None}, "mem_total"), ({"time": "now"}, "'time' must be a number"),
    ({"gpus": [{"index": 0}]}, "'gpus[0].name' is missing"), ({"cpu_percent": -1.0}, "'cpu_percent' must not be negative"),
    ({"load1": float("nan")}, "'load1'"),
])
def test_a_sample_that_does_not_decode_names_its_field_in_one_line(change: dict[str, Any], needle: str) -> None:
    with pytest.raises(DecodeError) as e:
        decode(NodeSample, {**encode(SAMPLE), **change})
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)

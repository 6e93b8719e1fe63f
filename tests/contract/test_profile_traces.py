"""The profile's wire types and a trace read back: the step's shares, the top operators, the merged timeline."""

from __future__ import annotations

import json

import pytest

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.profile import ProfileReply, ProfileRequest, RankDone
from higgsfield.contract.traces import merge, shares_line, summarize

pytestmark = pytest.mark.timeout(30)


def _x(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op", pid: int = 7) -> dict[str, object]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}


def _trace(base: int = 1_000_000_000) -> dict[str, object]:
    """Two 100 us steps on thread 1: 40 us of compute (a matmul over an add), 20 us in a collective (its gloo
    work on thread 2 runs 10 us past it), the rest under no op."""
    ev = [{"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "python3"}}]
    for k, t0 in ((5, 0.0), (6, 100.0)):
        ev += [_x(f"ProfilerStep#{k}", t0, 100, cat="user_annotation"),
               _x("aten::mm", t0 + 10, 40), _x("aten::add", t0 + 20, 10),
               _x("c10d::allreduce_", t0 + 60, 20), _x("gloo:all_reduce", t0 + 60, 30, tid=2, cat="user_annotation")]
    ev.append({"ph": "i", "name": "Iteration Start", "pid": "Traces", "tid": "x", "ts": 0})
    return {"baseTimeNanoseconds": base, "traceEvents": ev}


def test_summarize_splits_each_step_into_compute_communication_and_waiting() -> None:
    s = summarize(_trace())
    assert s.steps == [5, 6] and s.step_ms == pytest.approx(0.2)
    assert (s.compute, s.communication, s.waiting) == (pytest.approx(0.4), pytest.approx(0.3), pytest.approx(0.3))
    top = {o.name: (o.self_ms, o.calls) for o in s.top}
    assert top["aten::mm"] == (pytest.approx(0.06), 2)      # 40 us minus its 10 us child, twice
    assert top["aten::add"] == (pytest.approx(0.02), 2)
    assert shares_line(s) == "2 step(s), 0.2 ms: compute 40%, communication 30%, waiting 30%"
    assert summarize({}).steps == [] and summarize({"traceEvents": "x"}).step_ms == 0


def test_merge_gives_every_rank_a_named_process_on_one_clock() -> None:
    m = merge([("n0", 0, _trace()), ("n1", 3, _trace(base=1_000_500_000))])
    names = {e["pid"]: e["args"]["name"] for e in m["traceEvents"] if e.get("name") == "process_name"}
    assert names == {0: "n0 rank 0", 16: "n1 rank 3"}
    steps = [(e["pid"], e["ts"]) for e in m["traceEvents"] if e.get("name") == "ProfilerStep#5"]
    assert steps == [(0, 0.0), (16, 500.0)]           # the second trace began 500 us later
    assert all(isinstance(e["pid"], int) for e in m["traceEvents"])   # kineto's own tracks left out
    assert m["otherData"]["ranks"] == ["n0/0", "n1/3"]
    json.dumps(m)


def test_the_wire_types_round_trip_and_refuse_bad_fields() -> None:
    req = ProfileRequest(id="20261206-063000-abcdef", steps=3, deadline=1.5, ranks=[1], memory=True)
    assert decode(ProfileRequest, json.loads(json.dumps(encode(req)))) == req
    with pytest.raises(DecodeError, match="'steps'"):
        decode(ProfileRequest, {**encode(req), "steps": 0})
    with pytest.raises(DecodeError, match="'id'"):
        decode(ProfileRequest, {**encode(req), "id": "../x"})
    reply = ProfileReply(run="r1", state="running", id=req.id, root="/x", done=[RankDone(rank=1, steps=[4, 5, 6])],
                         missing=[0])
    wire = json.loads(json.dumps(encode(reply)))
    assert wire["version"] == 1 and decode(ProfileReply, wire) == reply

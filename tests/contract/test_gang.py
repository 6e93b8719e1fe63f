"""The gang wire's messages: today's bytes exactly (a node of this release talks to one of the last), every
kind decodes back to itself, and any line is a message or one DecodeError."""

from __future__ import annotations

import json
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from higgsfield.contract.codec import DecodeError, decode_tagged, encode
from higgsfield.contract.failure import Failure, Verdict
from higgsfield.contract.gang import (
    KINDS,
    Abort,
    Admission,
    Admitted,
    Bye,
    Cancel,
    Challenge,
    Failed,
    FinalVerdict,
    Finished,
    Go,
    Heartbeat,
    Hello,
    Killed,
    LastWord,
    Message,
    Prepare,
    Progress,
    Progressing,
    Ready,
    Regroup,
    Restart,
    Stacks,
    Stall,
    Stalled,
    StallPhase,
    Standby,
    Standbys,
    Stopped,
    Straggling,
    Unadmitted,
    Welcome,
    claimed_kind,
)
from higgsfield.contract.stacks import MAIN, Diagnosis, Frame, Group, RankStacks, Thread
from higgsfield.contract.straggler import RankWork, Straggler

F = Failure("n1", 3, 1.5, "rank 3: boom", ["line"])
F_WIRE = {"version": 1, "node": "n1", "rank": 3, "at": 1.5, "reason": "rank 3: boom", "tail": ["line"],
          "lost": False}
FRAME = Frame("train", "/c/train.py", 88, "dist.all_reduce(t)")
FRAME_WIRE = {"function": "train", "file": "/c/train.py", "line": 88, "code": "dist.all_reduce(t)"}
STACKS = RankStacks("n1", 3, 42, (Thread(MAIN, (FRAME,)),))
STACKS_WIRE = {"node": "n1", "rank": 3, "pid": 42, "threads": [{"name": MAIN, "frames": [FRAME_WIRE]}], "native": ""}
D = Diagnosis((Group(("n1/3",), "all_reduce at train.py:88", (FRAME,)),), ("n1/3",), "n1/3 waits")
D_WIRE = {"groups": [{"ranks": ["n1/3"], "where": "all_reduce at train.py:88", "frames": [FRAME_WIRE]}],
          "odd": ["n1/3"], "summary": "n1/3 waits"}

# Each kind as the dict-based wire (before contract.gang) wrote it: the same keys, the same values.
TODAY: list[tuple[Message, dict[str, object]]] = [
    (Challenge("ns"), {"t": "challenge", "nonce": "ns"}),
    (Hello(1, "n1", "nm", "ab"), {"t": "hello", "rank": 1, "node": "n1", "nonce": "nm", "mac": "ab"}),
    (Welcome("cd"), {"t": "welcome", "mac": "cd"}),
    (Heartbeat(), {"t": "hb"}),
    (Admitted(), {"t": "admitted"}),
    (Unadmitted(), {"t": "unadmitted"}),
    (Ready(), {"t": "ready"}),
    (Progress(at=2.5, steps=True), {"t": "progress", "at": 2.5, "steps": True}),
    (Stacks((STACKS,)), {"t": "stacks", "ranks": [STACKS_WIRE]}),
    (Finished(), {"t": "finished"}),
    (Failed(F), {"t": "failed", "failure": F_WIRE}),
    (Killed(), {"t": "killed"}),
    (Stopped(), {"t": "stopped"}),
    (Prepare(), {"t": "prepare"}),
    (Cancel(), {"t": "cancel"}),
    (Go(29500), {"t": "go", "port": 29500}),
    (Abort("failed", F), {"t": "abort", "kind": "failed", "failure": F_WIRE}),
    (Abort("killed", node="n2"), {"t": "abort", "kind": "killed", "node": "n2"}),
    (FinalVerdict("failed", F), {"t": "verdict", "kind": "failed", "failure": F_WIRE}),
    (FinalVerdict("killed"), {"t": "verdict", "kind": "killed"}),
    (Bye(), {"t": "bye"}),
    (Stall(), {"t": "stall"}),
    (Stalled(D, 7.0), {"t": "stalled", "diagnosis": D_WIRE, "at": 7.0}),
    (Progressing(), {"t": "progressing"}),
    (Restart(), {"t": "restart"}),
    (Progress(at=2.5, steps=True, work=(RankWork(rank=3, step=9, steps=2, own_s=0.25, step_s=0.3),)),
     {"t": "progress", "at": 2.5, "steps": True,
      "work": [{"rank": 3, "step": 9, "steps": 2, "own_s": 0.25, "step_s": 0.3, "node": ""}]}),
    (Straggling((Straggler("n2", 3, 1.3, 31, 40, 0.26, 0.2, 8.0),), 8.0),
     {"t": "straggling", "stragglers": [{"node": "n2", "rank": 3, "ratio": 1.3, "since_step": 31, "step": 40,
                                        "own_s": 0.26, "median_s": 0.2, "at": 8.0}], "at": 8.0}),
    (Regroup(nodes=("n0", "n1"), lost=("n2",), recovery=1),
     {"t": "regroup", "nodes": ["n0", "n1"], "lost": ["n2"], "recovery": 1}),
    (Standby(29512), {"t": "standby", "port": 29512}),
    (Standbys({"n1": 29512, "n2": 29613}), {"t": "standbys", "ports": {"n1": 29512, "n2": 29613}}),
]


def test_every_kind_is_in_kinds_and_has_a_case_here() -> None:
    assert set(KINDS.values()) == set(typing.get_args(Message))
    assert {type(m) for m, _ in TODAY} == set(KINDS.values())
    assert all(tag == cls.TAG for tag, cls in KINDS.items())


@pytest.mark.parametrize("msg, wire", TODAY, ids=[m.TAG + "-" + str(i) for i, (m, _) in enumerate(TODAY)])
def test_the_bytes_are_today_s_and_decode_back(msg: Message, wire: dict[str, object]) -> None:
    assert encode(msg) == wire
    back = decode_tagged(KINDS, json.loads(json.dumps(wire)))
    if isinstance(msg, Failed):     # a member's report: its node is the coordinator's to name
        assert isinstance(back, Failed) and back.failure is not None and back.failure.node is None
        assert back.failure == Failure(None, 3, 1.5, "rank 3: boom", ["line"])
    else:
        assert back == msg


def test_a_verdict_message_is_a_verdict_with_a_tag() -> None:
    v = Verdict("failed", F)
    assert Abort.of(v).verdict == v and FinalVerdict.of(v).verdict == v
    assert not isinstance(FinalVerdict.of(v), Abort)    # dispatching on Abort never takes the final verdict


@pytest.mark.parametrize("data, why", [
    ({"t": "go", "port": "29500"}, "'port' must be an integer, not a string"),
    ({"t": "go", "port": 0}, "'port' must be a TCP port"),
    ({"t": "abort", "kind": "failed"}, "a 'failed' verdict without its failure"),
    ({"t": "abort", "kind": "maybe"}, "'kind' must be one of failed, killed"),
    ({"t": "verdict", "kind": "killed", "node": "a\nb"}, "not a node name"),
    ({"t": "failed", "failure": {**F_WIRE, "version": 9}}, "version 9"),
    ({"t": "stacks", "ranks": "all"}, "'ranks' must be a list, not a string"),
    ({"t": "stalled", "at": 1.0}, "'diagnosis' is missing"),
    ({"t": "hello", "rank": 0, "nonce": "x", "mac": "00"}, "'node' is missing"),
    ({"t": "from-a-newer-node"}, "unknown kind 'from-a-newer-node'"),
    ({"kind": "failed"}, "unknown kind"),
    (["hb"], "a message is a list, not an object"),
])
def test_a_malformed_message_is_one_decode_error(data: object, why: str) -> None:
    with pytest.raises(DecodeError) as e:
        decode_tagged(KINDS, data)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_a_node_s_stacks_that_do_not_decode_are_left_out_one_by_one() -> None:
    got = decode_tagged(KINDS, {"t": "stacks", "ranks": [STACKS_WIRE, {"rank": "x"}, 7]})
    assert got == Stacks((STACKS,))


def test_the_kind_a_broken_line_claims() -> None:
    assert claimed_kind({"t": "failed", "failure": 1}) is Failed
    assert claimed_kind({"t": "nope"}) is None and claimed_kind([1]) is None and claimed_kind({"t": 1}) is None


def test_states_read_as_today_s_strings() -> None:
    assert Admission.READY == "ready" and f"{Admission.WAITING}" == "waiting" and str(Admission.ADMITTED) == "admitted"
    assert f"{LastWord.LOST}" == "lost" and str(StallPhase.COLLECT) == "collect"
    assert "ready" in {Admission.READY} and Admission.READY in {"ready"}
    assert json.dumps(encode({"s": StallPhase.WAITING})) == '{"s": "waiting"}'


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
                           max_leaves=10)
field_names = st.sampled_from(sorted({"rank", "node", "nonce", "mac", "at", "steps", "ranks", "failure", "port",
                                      "kind", "diagnosis", "version", "other"}))


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(KINDS)), st.dictionaries(field_names, json_values, max_size=6))
def test_any_line_is_a_message_or_one_decode_error(tag: str, data: dict[str, object]) -> None:
    try:
        msg = decode_tagged(KINDS, {**data, "t": tag})
    except DecodeError as e:
        assert "\n" not in str(e)
    else:
        assert type(msg) is KINDS[tag]

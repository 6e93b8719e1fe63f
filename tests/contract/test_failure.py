"""The failure that travels between a run's nodes and into their records (higgsfield.contract.failure)."""

from __future__ import annotations

import json

import pytest

from higgsfield.contract.codec import DecodeError, decode, encode
from higgsfield.contract.failure import Failure


def test_a_failure_round_trips_through_json() -> None:
    f = Failure(node="gpu-2", rank=5, at=1733300000.5, reason="rank 5: RuntimeError: boom", tail=["a", "b"])
    back = decode(Failure, json.loads(json.dumps(encode(f))))
    assert back == f and encode(back)["version"] == 1


def test_an_earlier_releases_failure_without_a_version_reads() -> None:
    old = {"node": "n1", "rank": None, "at": 12.0, "reason": "node n1 was lost: timeout", "tail": [], "lost": True}
    f = decode(Failure, old)
    assert f.lost and f.rank is None and f.node == "n1"


@pytest.mark.parametrize(("data", "words"), [
    ({"version": 2, "node": "n", "rank": 0, "at": 1.0, "reason": "x"}, "version 2"),
    ({"node": "n", "rank": "zero", "at": 1.0, "reason": "x"}, "'rank' must be"),
    ({"node": "n", "rank": -1, "at": 1.0, "reason": "x"}, "not a rank"),
    ({"node": "n", "rank": 0, "reason": "x"}, "'at' is missing"),
    ({"node": "n\x1b[2J", "rank": 0, "at": 1.0, "reason": "x"}, "control character"),
    ({"node": "n", "rank": 0, "at": 1.0, "reason": "x" * 5000}, "too long"),
    (["not", "an", "object"], "not an object"),
])
def test_a_damaged_failure_is_refused_in_one_line(data: object, words: str) -> None:
    with pytest.raises(DecodeError) as e:
        decode(Failure, data)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_the_tail_is_bounded_and_the_first_failure_sorts_first() -> None:
    f = decode(Failure, {"node": "n", "rank": 1, "at": 2.0, "reason": "x", "tail": [str(i) for i in range(500)]})
    assert len(f.tail) == 50 and f.tail[-1] == "499"
    lost = Failure("a", None, 2.0, "lost", lost=True)
    assert min([f, lost, Failure("b", 0, 1.0, "first")], key=Failure.sort_key).node == "b"
    assert min([f, lost], key=Failure.sort_key) is lost

"""Stacks at a stall and their diagnosis (higgsfield.contract.stacks): parsing, grouping, the one-line summary."""

from __future__ import annotations

import json

import pytest

from higgsfield.contract.codec import DecodeError, decode, encode
from higgsfield.contract.stacks import (
    MAIN,
    Diagnosis,
    Frame,
    RankStacks,
    Thread,
    diagnose,
    parse_faulthandler,
    render,
)

pytestmark = pytest.mark.timeout(30)

DUMP = """\
Thread 0x00007f427f4a86c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f42803dbb80 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2501 in all_reduce
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/home/u/code/src/train.py", line 88 in train
  File "/venv/lib/python3.11/site-packages/higgsfield/node/entrypoint.py", line 260 in run
  <no Python frame>
"""

SLEEPING = """\
Current thread 0x00000000000000aa (most recent call first):
  File "/home/u/code/src/data.py", line 17 in load
  File "/home/u/code/src/train.py", line 80 in train
"""


def _frames(text: str, main: int | None = None) -> tuple[Thread, ...]:
    return parse_faulthandler(text, main)


def test_faulthandler_text_parses_innermost_last_and_names_the_main_thread() -> None:
    threads = _frames(DUMP, 0x00007F42803DBB80)
    assert [t.name for t in threads] == ["0x00007f427f4a86c0", MAIN]
    main = threads[1].frames
    assert main[-1] == Frame("all_reduce", "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
                             2501)
    assert main[0].function == "run" and len(main) == 4


def test_a_second_dump_appended_replaces_the_first() -> None:
    threads = _frames(SLEEPING + "\n" + SLEEPING.replace("line 17", "line 18"))
    assert len(threads) == 1 and threads[0].frames[-1].line == 18


def test_the_odd_rank_is_named_with_its_line_and_the_others_wait_in_the_collective() -> None:
    waiting = _frames(DUMP, 0x00007F42803DBB80)
    asleep = tuple(Thread(MAIN, tuple(f if f.line != 17 else Frame(f.function, f.file, 17, "time.sleep(3600)")
                                      for f in t.frames)) for t in _frames(SLEEPING))
    stacks = [RankStacks("hfnode1", 0, 10, waiting), RankStacks("hfnode1", 1, 11, asleep),
              RankStacks("hfnode2", 0, 12, waiting), RankStacks("hfnode2", 1, 13, waiting)]
    d = diagnose(stacks)
    assert d.odd == ("hfnode1/1",)
    assert d.groups[0].ranks == ("hfnode1/0", "hfnode2/0", "hfnode2/1") and d.groups[0].waiting
    assert d.summary == ("hfnode1/0, hfnode2/0, hfnode2/1 wait in all_reduce at train.py:88; "
                         "hfnode1/1 is at data.py:17 `time.sleep(3600)`")
    assert d.first_odd == ("hfnode1", 1)
    text = render(stacks, d)
    assert text.startswith(d.summary) and "== hfnode2/1 (pid 13) ==" in text and "time.sleep(3600)" in text
    assert decode(Diagnosis, json.loads(json.dumps(encode(d)))) == d


def test_on_a_tie_the_group_in_a_collective_is_the_majority() -> None:
    d = diagnose([RankStacks("n", 0, 1, _frames(SLEEPING)), RankStacks("n", 1, 2, _frames(DUMP, 0x7F42803DBB80))])
    assert d.odd == ("n/0",) and d.summary.startswith("n/1 waits in all_reduce")


def test_a_rank_that_did_not_answer_is_its_own_group_and_nothing_is_an_empty_diagnosis() -> None:
    d = diagnose([RankStacks("n", 0, 1, _frames(SLEEPING)), RankStacks("n", 1, 2, _frames(SLEEPING)),
                  RankStacks("n", 2, 3, ())])
    assert d.odd == ("n/2",) and "did not answer" in d.summary
    assert diagnose([]).summary and diagnose([]).odd == ()


def test_a_node_that_sent_no_stacks_is_odd_never_the_majority_and_named_before_the_waiting() -> None:
    waiting = _frames(DUMP, 0x7F42803DBB80)
    d = diagnose([RankStacks("n0", 0, 1, waiting), RankStacks("n0", 1, 2, waiting)], silent=["n1"])
    assert d.odd == ("n1",) and d.first_odd == ("n1", None)
    assert d.summary == "n0/0, n0/1 wait in all_reduce at train.py:88; n1 is without stacks (no answer from the node)"
    assert decode(Diagnosis, json.loads(json.dumps(encode(d)))) == d
    # more silent nodes than answering ranks: still odd; with nobody answering, every node is odd
    many = diagnose([RankStacks("n0", 0, 1, waiting)], silent=["n1", "n2"])
    assert many.groups[0].ranks == ("n0/0",) and many.odd == ("n1", "n2")
    alone = diagnose([], silent=["n0", "n1"])
    assert alone.odd == ("n0", "n1") and alone.summary == "n0, n1 are without stacks (no answer from the node)"
    # an odd rank that answered away from the collective still comes first: it is what the others wait for
    asleep = diagnose([RankStacks("n0", 0, 1, waiting), RankStacks("n0", 1, 2, waiting),
                       RankStacks("n2", 0, 3, _frames(SLEEPING))], silent=["n1"])
    assert asleep.odd == ("n2/0", "n1")


def test_rank_stacks_round_trip_and_a_bad_shape_is_one_decode_error() -> None:
    s = RankStacks("hfnode1", 3, 99, _frames(DUMP, 0x7F42803DBB80), native="Thread 1 (idle)")
    d = encode(s)
    assert set(d) == {"node", "rank", "pid", "threads", "native"}
    assert set(d["threads"][0]["frames"][0]) == {"function", "file", "line", "code"}
    assert decode(RankStacks, json.loads(json.dumps(d))) == s
    for bad in ([], {**d, "rank": "1"}, {**d, "threads": [{"name": "x", "frames": [{"file": "a"}]}]},
                {**d, "threads": "no"}):
        with pytest.raises(DecodeError):
            decode(RankStacks, bad)
    with pytest.raises(DecodeError):
        decode(Diagnosis, {"groups": [], "odd": [1], "summary": "x"})


def test_the_same_code_under_other_directories_is_one_group_and_a_non_waiting_odd_rank_is_named_first() -> None:
    def waiting(home: str) -> tuple[Thread, ...]:
        return (Thread(MAIN, (Frame("train", f"{home}/releases/a/src/train.py", 88),
                              Frame("all_reduce", f"{home}/env/site-packages/torch/distributed/distributed_c10d.py",
                                    3913))),)

    stuck = (Thread(MAIN, (Frame("train", "/home/n9/releases/b/src/train.py", 80),)),)
    d = diagnose([RankStacks("n8", 0, 1, waiting("/home/n8")), RankStacks("n8", 1, 2, waiting("/home/n8")),
                  RankStacks("n9", 2, 3, waiting("/home/n9")), RankStacks("n9", 3, 4, stuck)])
    assert d.odd == ("n9/3",) and d.groups[0].ranks == ("n8/0", "n8/1", "n9/2")
    three = diagnose([RankStacks("a", 0, 1, waiting("/x")), RankStacks("a", 1, 1, waiting("/x")),
                      RankStacks("b", 2, 1, (Thread(MAIN, (Frame("f", "/y/other.py", 5),)),)),
                      RankStacks("b", 3, 1, (Thread(MAIN, (Frame("train", "/x/src/train.py", 99),
                                                           Frame("barrier", "/t/torch/distributed/c.py", 1))),))])
    assert three.first_odd == ("b", 2)

"""The coordinator's stall watchdog over real loopback TCP (members as the supervisors would be): a stall is
broadcast, stacks are collected and diagnosed, then fail | restart | wait."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from typing import TypeVar

import pytest

from higgsfield.contract.gang import (
    Abort,
    Admitted,
    Go,
    Heartbeat,
    Prepare,
    Progress,
    Progressing,
    Ready,
    Restart,
    Stacks,
    Stall,
    Stalled,
)
from higgsfield.contract.stacks import MAIN, Frame, RankStacks, Thread
from higgsfield.contract.stall_policy import OnStall, StallPolicy
from higgsfield.node.gang import wire
from higgsfield.node.gang.coordinator import Coordinator
from higgsfield.node.gang.listener import listen
from higgsfield.node.gang.member import Inbox, Member

M = TypeVar("M")

pytestmark = pytest.mark.timeout(60)

TOKEN = "cd" * 32
NODES = ["n0", "n1"]
WAIT = (Frame("train", "/c/src/train.py", 88, "dist.all_reduce(t)"),
        Frame("all_reduce", "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2501))
ASLEEP = (Frame("train", "/c/src/train.py", 80, "time.sleep(3600)"),)


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "HEARTBEAT_S", 0.2)
    monkeypatch.setattr(wire, "LOST_S", 3.0)


class Gang:
    def __init__(self, policy: StallPolicy, max_restarts: int = 0) -> None:
        self.sock = listen()
        self.coordinator = Coordinator(self.sock, token=TOKEN, run="r", nodes=NODES, pick_port=lambda: 29999,
                                       stall=policy, max_restarts=max_restarts)
        self.coordinator.start()
        self.members: list[Member] = []
        self.inboxes: list[Inbox] = []
        for rank in range(len(NODES)):
            inbox: Inbox = queue.Queue()
            m = Member("127.0.0.1", self.sock.getsockname()[1], token=TOKEN, run="r", rank=rank, node=NODES[rank],
                       coordinator_node=NODES[0], inbox=inbox)
            m.connect(time.monotonic() + 10)
            m.start()
            self.members.append(m)
            self.inboxes.append(inbox)
        for m in self.members:
            m.send(Admitted())
        self.expect(Prepare)
        for m in self.members:
            m.send(Ready())
        self.expect(Go)

    def expect(self, kind: type[M], timeout: float = 10.0) -> list[M]:
        out = []
        for inbox in self.inboxes:
            deadline = time.monotonic() + timeout
            while True:
                msg = inbox.get(timeout=max(0.01, deadline - time.monotonic()))
                if isinstance(msg, kind):
                    out.append(msg)
                    break
        return out

    def answer_stacks(self) -> None:
        for node_rank, m in enumerate(self.members):
            ranks = [RankStacks("whatever", 2 * node_rank + i, 100 + i,
                                (Thread(MAIN, ASLEEP if (node_rank, i) == (1, 1) else WAIT),)) for i in range(2)]
            m.send(Stacks(tuple(ranks)))

    def close(self) -> None:
        for m in self.members:
            m.close()
        self.coordinator.close()


@pytest.fixture()
def gang(request: pytest.FixtureRequest) -> Iterator[Gang]:
    policy, max_restarts = request.param if isinstance(request.param, tuple) else (request.param, 0)
    g = Gang(policy, max_restarts)
    yield g
    g.close()


@pytest.mark.parametrize("gang", [StallPolicy(1.0, 30.0, OnStall.FAIL)], indirect=True)
def test_a_stall_fails_the_run_naming_the_odd_rank_by_the_sender_s_node(gang: Gang) -> None:
    t0 = time.monotonic()
    for m in gang.members:
        m.send(Progress(at=time.time(), steps=True))
    gang.expect(Stall)
    assert 0.9 <= time.monotonic() - t0 < 3.0
    gang.answer_stacks()
    stalled = gang.expect(Stalled)
    assert stalled[0].diagnosis.odd == ("n1/3",)
    abort = gang.expect(Abort)
    failure = abort[0].failure
    assert failure is not None
    assert (failure.node, failure.rank) == ("n1", 3)
    assert failure.reason == ("stalled: n0/0, n0/1, n1/2 wait in all_reduce at train.py:88; "
                              "n1/3 is at train.py:80 `time.sleep(3600)`")


@pytest.mark.parametrize("gang", [StallPolicy(1.0, 30.0, OnStall.WAIT)], indirect=True)
def test_on_stall_wait_says_progressing_when_a_node_progresses_again(gang: Gang) -> None:
    gang.members[0].send(Progress(at=time.time(), steps=True))
    gang.expect(Stall)
    gang.answer_stacks()
    gang.expect(Stalled)
    time.sleep(1.5)     # still stalled: no second stall is broadcast while waiting
    assert all(isinstance(m, Heartbeat) for inbox in gang.inboxes for m in list(inbox.queue)), gang.inboxes[0].queue
    gang.members[1].send(Progress(at=time.time(), steps=False))
    gang.expect(Progressing)


@pytest.mark.parametrize("gang", [(StallPolicy(1.0, 1.0, OnStall.RESTART), 1)], indirect=True)
def test_on_stall_restart_restarts_while_restarts_are_left_then_fails(gang: Gang) -> None:
    gang.expect(Stall)              # the startup timeout: no progress at all
    gang.answer_stacks()
    gang.expect(Restart)
    gang.expect(Stall)              # again: no restart left
    gang.answer_stacks()
    failure = gang.expect(Abort)[0].failure
    assert failure is not None and failure.reason.startswith("stalled: ")


@pytest.mark.parametrize("gang", [StallPolicy(1.0, 30.0, OnStall.FAIL)], indirect=True)
def test_a_node_that_sends_no_stacks_does_not_hold_the_verdict(gang: Gang, monkeypatch: pytest.MonkeyPatch) -> None:
    from higgsfield.node.gang import stall

    monkeypatch.setattr(stall, "STACKS_WAIT_S", 1.0)
    gang.members[0].send(Progress(at=time.time(), steps=True))
    gang.expect(Stall)
    gang.members[0].send(Stacks((RankStacks("n0", 0, 1, (Thread(MAIN, WAIT),)),)))
    stalled = gang.expect(Stalled)
    assert stalled[0].diagnosis.odd == ("n1",)
    failure = gang.expect(Abort)[0].failure
    assert failure is not None
    # n0/0 only waits for n1: the node that sent nothing is the one named, not the rank that answered
    assert (failure.node, failure.rank) == ("n1", None), failure
    assert failure.reason == ("stalled: n0/0 waits in all_reduce at train.py:88; "
                              "n1 is without stacks (no answer from the node)"), failure

"""A run that loses a node goes on without it: the coordinator over real loopback TCP (members as the
supervisors would be), and its rule (:mod:`higgsfield.node.gang.recovery`) alone.

- a lost node (its connection drops) with ``min_nodes`` allowing: every survivor stops and says so, then gets
  ``regroup`` (its nodes now) instead of a verdict; admission starts over on the survivors and ``go`` gives
  the next attempt a new rendezvous port; the lost node cannot join again;
- a second loss past ``max_recoveries``: the verdict names it and the loss recovered from before;
- a spare (admitted with the run, standing by) takes a lost node's place, and the run keeps its size; a spare
  lost while it stands by fails nothing;
- a rank that crashed is no lost node, and a run without ``min_nodes`` fails as before.
"""

from __future__ import annotations

import itertools
import queue
import time
from typing import TypeVar

import pytest

from higgsfield.contract.failure import Failure
from higgsfield.contract.gang import (
    Abort,
    Admitted,
    Failed,
    FinalVerdict,
    Go,
    LastWord,
    Prepare,
    Ready,
    Regroup,
    Stopped,
)
from higgsfield.node.gang import wire
from higgsfield.node.gang.coordinator import Coordinator
from higgsfield.node.gang.listener import listen
from higgsfield.node.gang.member import Inbox, Member
from higgsfield.node.gang.recovery import WAIT, Decision, decide, next_step

M = TypeVar("M")

pytestmark = pytest.mark.timeout(60)

TOKEN = "ef" * 32
NODES = ["n0", "n1", "n2"]


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "HEARTBEAT_S", 0.2)
    monkeypatch.setattr(wire, "LOST_S", 3.0)


class Gang:
    def __init__(self, min_nodes: int, max_recoveries: int, spares: int = 0) -> None:
        self.sock = listen()
        ports = itertools.count(29000)
        self.coordinator = Coordinator(self.sock, token=TOKEN, run="r", nodes=NODES, pick_port=lambda: next(ports),
                                       min_nodes=min_nodes, max_recoveries=max_recoveries, spares=spares)
        self.coordinator.start()
        self.members = [self.join(rank) for rank in range(len(NODES))]
        self.admit(self.members)

    def join(self, rank: int) -> Member:
        inbox: Inbox = queue.Queue()
        m = Member("127.0.0.1", self.sock.getsockname()[1], token=TOKEN, run="r", rank=rank, node=NODES[rank],
                   coordinator_node=NODES[0], inbox=inbox)
        m.connect(time.monotonic() + 10)
        m.start()
        return m

    def admit(self, members: list[Member]) -> int:
        for m in members:
            m.send(Admitted())
        expect(members, Prepare)
        for m in members:
            m.send(Ready())
        return expect(members, Go)[0].port

    def close(self) -> None:
        for m in self.members:
            m.close()
        self.coordinator.close()


def expect(members: list[Member], kind: type[M], timeout: float = 10.0) -> list[M]:
    out = []
    for m in members:
        deadline = time.monotonic() + timeout
        while True:
            msg = m.inbox.get(timeout=max(0.01, deadline - time.monotonic()))
            if isinstance(msg, kind):
                out.append(msg)
                break
    return out


def test_a_lost_node_regroups_the_survivors_who_start_again_and_a_second_loss_past_the_limit_fails() -> None:
    g = Gang(min_nodes=1, max_recoveries=1)
    try:
        n0, n1, n2 = g.members
        n2.close()   # node 2's supervisor is gone: its connection closes
        expect([n0, n1], Abort)
        time.sleep(1.5)
        assert all(not isinstance(x, (FinalVerdict, Regroup)) for x in list(n0.inbox.queue))   # survivors first stop
        for m in (n0, n1):
            m.send(Stopped())
        (r0, r1) = expect([n0, n1], Regroup)
        assert r0 == r1 == Regroup(nodes=("n0", "n1"), lost=("n2",), recovery=1)
        assert n0.regroup == r0 and n0.verdict_final.is_set()
        assert g.coordinator.recoveries[0][1] == ["n2"]
        port = g.admit([n0, n1])
        assert port == 29001   # the next attempt's own rendezvous port
        with pytest.raises(wire.WireError):   # the lost node never rejoins this run
            g.join(2)

        n1.close()   # a second loss, past max_recoveries=1: the run fails, naming both losses
        expect([n0], Abort)
        n0.send(Stopped())
        (verdict,) = expect([n0], FinalVerdict)
        assert verdict.failure is not None and verdict.failure.lost and verdict.failure.node == "n1"
        assert verdict.failure.reason.endswith("(after recovering from the loss of n2)"), verdict.failure.reason
    finally:
        g.close()


def test_a_spare_takes_the_lost_node_s_place_and_a_lost_spare_fails_nothing() -> None:
    g = Gang(min_nodes=0, max_recoveries=3, spares=1)   # n0, n1 the run's nodes; n2 its spare, admitted too
    try:
        n0, n1, n2 = g.members
        n1.close()
        expect([n0, n2], Abort)
        n0.send(Stopped())   # the spare has no torchrun to stop: nobody waits for it
        (r0, r2) = expect([n0, n2], Regroup)
        assert r0 == r2 == Regroup(nodes=("n0", "n2"), lost=("n1",), recovery=1)
        assert g.admit([n0, n2]) == 29001
    finally:
        g.close()
    g = Gang(min_nodes=0, max_recoveries=3, spares=1)
    try:
        n0, n1, n2 = g.members
        n2.close()   # the spare is lost while it stands by: the run goes on, and a loss now has no spare
        time.sleep(1.0)
        assert all(not isinstance(x, Abort) for m in (n0, n1) for x in list(m.inbox.queue))
        assert g.coordinator.spares == []
        n1.close()
        expect([n0], Abort)
        n0.send(Stopped())
        (verdict,) = expect([n0], FinalVerdict)
        assert verdict.failure is not None and verdict.failure.node == "n1"
    finally:
        g.close()


def test_a_rank_crash_is_no_lost_node_and_fails_the_run() -> None:
    g = Gang(min_nodes=1, max_recoveries=3)
    try:
        n0, n1, n2 = g.members
        n1.send(Failed(Failure("n1", 3, time.time(), "ValueError: boom")))
        expect([n0, n2], Abort)
        for m in (n0, n2):
            m.send(Stopped())
        (verdict, _) = expect([n0, n2], FinalVerdict)
        assert verdict.failure is not None and (verdict.failure.node, verdict.failure.rank) == ("n1", 3)
        assert not g.coordinator.recoveries
    finally:
        g.close()


def test_without_min_nodes_a_lost_node_fails_the_run_at_once() -> None:
    g = Gang(min_nodes=0, max_recoveries=3)
    try:
        n0, n1, n2 = g.members
        n2.close()
        expect([n0, n1], Abort)
        (verdict, _) = expect([n0, n1], FinalVerdict, timeout=5)   # no survivor's word awaited
        assert verdict.failure is not None and verdict.failure.lost and verdict.failure.node == "n2"
    finally:
        g.close()


def test_the_rule() -> None:
    lost = Failure("n2", None, 1.0, "node n2 was lost: connection closed", lost=True)
    crash = Failure("n1", 2, 1.0, "ValueError")
    assert decide([0, 1, 2], {2}, lost, min_nodes=2, recoveries=0, max_recoveries=3) == Decision((0, 1), (2,))
    assert decide([0, 1, 2], {1, 2}, lost, min_nodes=2, recoveries=0, max_recoveries=3) is None   # too few left
    assert decide([0, 1, 2], {2}, lost, min_nodes=2, recoveries=3, max_recoveries=3) is None      # none left
    assert decide([0, 1, 2], {2}, crash, min_nodes=2, recoveries=0, max_recoveries=3) is None     # a crash
    assert decide([0, 1, 2], {0}, lost, min_nodes=1, recoveries=0, max_recoveries=3) is None      # node 0 itself
    assert decide([0, 1], {1}, lost, min_nodes=0, recoveries=0, max_recoveries=3, spares=(2, 3)) == \
        Decision((0, 2), (1,))                                                                     # a spare in
    assert decide([0, 1], {1}, lost, min_nodes=0, recoveries=0, max_recoveries=3) is None          # none: fail
    final = {2: LastWord.LOST, 0: LastWord.STOPPED}
    assert next_step([0, 1, 2], final, lost, waited=1.0, min_nodes=2, recoveries=0, max_recoveries=3) == WAIT
    assert next_step([0, 1, 2], final, lost, waited=60.0, min_nodes=2, recoveries=0, max_recoveries=3) is None
    final[1] = LastWord.FAILED
    assert next_step([0, 1, 2], final, lost, waited=1.0, min_nodes=2, recoveries=0,
                     max_recoveries=3) == Decision((0, 1), (2,))

"""A run that loses a node goes on without it: the coordinator over real loopback TCP (members as the
supervisors would be), and its rule (:mod:`higgsfield.node.gang.recovery`) alone.

- a lost node (its connection drops) with ``min_nodes`` allowing: every survivor stops and says so, then gets
  ``regroup`` (its nodes now) instead of a verdict; admission starts over on the survivors and ``go`` gives
  the next attempt a new rendezvous port; the lost node cannot join again;
- a second loss past ``max_recoveries``: the verdict names it and the loss recovered from before;
- a spare (admitted with the run, standing by) takes a lost node's place, and the run keeps its size; a spare
  lost while it stands by fails nothing;
- a rank that crashed is no lost node, and a run without ``min_nodes`` fails as before;
- node 0 (hosting the coordinator) lost: the next node takes the coordinator over on its standby port and the
  survivors regroup there (:mod:`higgsfield.node.gang.takeover`); an heir lost too ends the run, naming both.
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
    Progress,
    Ready,
    Regroup,
    Stopped,
)
from higgsfield.contract.runspec import RunSpec
from higgsfield.contract.straggler import RankWork
from higgsfield.node.gang import wire
from higgsfield.node.gang.coordinator import Coordinator
from higgsfield.node.gang.listener import listen
from higgsfield.node.gang.member import Inbox, Member
from higgsfield.node.gang.recovery import WAIT, Decision, decide, next_step
from higgsfield.node.runs.outcome import Outcome
from higgsfield.node.runs.succession import Succession

M = TypeVar("M")

pytestmark = pytest.mark.timeout(60)

TOKEN = "ef" * 32
NODES = ["n0", "n1", "n2"]


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "HEARTBEAT_S", 0.2)
    monkeypatch.setattr(wire, "LOST_S", 3.0)


class Gang:
    def __init__(self, min_nodes: int, max_recoveries: int, spares: int = 0, on_straggler: str = "warn") -> None:
        self.sock = listen()
        ports = itertools.count(29000)
        self.coordinator = Coordinator(self.sock, token=TOKEN, run="r", nodes=NODES, pick_port=lambda: next(ports),
                                       min_nodes=min_nodes, max_recoveries=max_recoveries, spares=spares,
                                       on_straggler=on_straggler)
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
    assert decide([0, 1, 2], {0}, lost, min_nodes=1, recoveries=0, max_recoveries=3) == \
        Decision((1, 2), (0,))                                                                     # node 0: its heir
    assert decide([0, 1], {1}, lost, min_nodes=0, recoveries=0, max_recoveries=3, spares=(2, 3)) == \
        Decision((0, 2), (1,))                                                                     # a spare in
    assert decide([0, 1], {1}, lost, min_nodes=0, recoveries=0, max_recoveries=3) is None          # none: fail
    final = {2: LastWord.LOST, 0: LastWord.STOPPED}
    assert next_step([0, 1, 2], final, lost, waited=1.0, min_nodes=2, recoveries=0, max_recoveries=3) == WAIT
    assert next_step([0, 1, 2], final, lost, waited=60.0, min_nodes=2, recoveries=0, max_recoveries=3) is None
    final[1] = LastWord.FAILED
    assert next_step([0, 1, 2], final, lost, waited=1.0, min_nodes=2, recoveries=0,
                     max_recoveries=3) == Decision((0, 1), (2,))


def _spec(node: str, nodes: tuple[str, ...], spares: tuple[str, ...] = (), min_nodes: int = 2) -> RunSpec:
    members = nodes + spares
    return RunSpec(project="p", experiment="e", run="r", module="m", code_dir="/c", params={}, node=node,
                   node_rank=members.index(node), nodes=nodes, spares=spares, master_addr="127.0.0.1",
                   submitted_at=1.0, min_nodes=min_nodes, max_recoveries=3,
                   addresses={n: "127.0.0.1" for n in members})


def test_node_0_lost_its_heir_takes_the_coordinator_over_and_the_survivors_regroup_there() -> None:
    """n0 (hosting the coordinator) dies; n1, the next node, coordinates from its standby port, n2 joins it there,
    both give their last words and get ``regroup`` with n1 as node 0; admission and ``go`` follow on n1, the lost
    n0 can never join, and a planted stranger on the standby port learns nothing."""
    g = Gang(min_nodes=2, max_recoveries=3)
    heirs = {r: Succession(_spec(NODES[r], tuple(NODES)), listen()) for r in (1, 2)}
    try:
        n0, n1, n2 = g.members
        for r, m in ((1, n1), (2, n2)):
            heirs[r].offer(m)
        wait = time.monotonic() + 10
        while len(n2.standbys) < 2 and time.monotonic() < wait:
            time.sleep(0.05)
        assert set(n1.standbys) == set(n2.standbys) == {"n1", "n2"}
        n0.close()
        g.coordinator.close()   # node 0 is gone, coordinator and all
        for m in (n1, n2):
            wait = time.monotonic() + 10
            while not m.lost and time.monotonic() < wait:
                time.sleep(0.05)
        assert heirs[1].heir(n1, _spec("n1", tuple(NODES)), NODES, False) == "n1"
        assert heirs[2].heir(n2, _spec("n2", tuple(NODES)), NODES, False) == "n1"
        assert heirs[2].heir(n2, _spec("n2", tuple(NODES)), NODES, True) is None   # a node being killed: no
        joined = [heirs[r].join(m, _spec(NODES[r], tuple(NODES)), NODES, m.inbox, token=TOKEN,
                                pick_port=lambda: 29100, stopping=lambda: False) for r, m in ((1, n1), (2, n2))]
        assert not isinstance(joined[0], Outcome) and not isinstance(joined[1], Outcome)
        (m1, hosted), (m2, none) = joined
        assert hosted is not None and none is None
        new = [m1, m2]
        g.members += new
        for m in new:
            m.send(Stopped())
        (r1, r2) = expect(new, Regroup)
        assert r1 == r2 == Regroup(nodes=("n1", "n2"), lost=("n0",), recovery=1)
        for m in new:
            m.send(Admitted())
        expect(new, Prepare)
        for m in new:
            m.send(Ready())
        assert expect(new, Go)[0].port == 29100   # the heir's rendezvous port
        late = Member("127.0.0.1", hosted.listener.getsockname()[1], token=TOKEN, run="r", rank=0, node="n0",
                      coordinator_node="n1", inbox=queue.Queue())
        with pytest.raises(wire.WireError):   # the lost node 0 never rejoins
            late.connect(time.monotonic() + 3)
        hosted.close()
    finally:
        g.close()


def test_a_lost_node_0_without_a_heir_to_reach_ends_the_run_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    from higgsfield.node.runs import succession

    monkeypatch.setattr(succession, "REGROUP_WAIT_S", 2.0)   # how long a survivor tries to reach the heir
    g = Gang(min_nodes=1, max_recoveries=3)
    heir = Succession(_spec("n1", tuple(NODES), min_nodes=1), listen())
    try:
        n0, n1, n2 = g.members
        heir.offer(n1)
        wait = time.monotonic() + 10
        while "n1" not in n2.standbys and time.monotonic() < wait:
            time.sleep(0.05)
        n1.close()
        heir.standby.close()   # n1, the heir, is gone too
        n0.close()
        g.coordinator.close()
        wait = time.monotonic() + 10
        while not n2.lost and time.monotonic() < wait:
            time.sleep(0.05)
        mine = Succession(_spec("n2", tuple(NODES), min_nodes=1), listen())
        out = mine.join(n2, _spec("n2", tuple(NODES), min_nodes=1), NODES, n2.inbox, token=TOKEN,
                        pick_port=lambda: 29100, stopping=lambda: False)
        assert isinstance(out, Outcome) and out.failure is not None
        assert out.failure.node == "n0" and "n1, which was to take it over, cannot be reached" in out.failure.reason
    finally:
        g.close()


def test_a_second_loss_during_the_recovery_s_admission_is_recovered_from_too() -> None:
    """n2 lost: regroup on n0, n1; before the next attempt's ``go``, n1 is lost as well: a second regroup, on n0
    alone (``min_nodes=1``), numbered 2 and naming both losses; admission then completes on n0."""
    g = Gang(min_nodes=1, max_recoveries=3)
    try:
        n0, n1, n2 = g.members
        n2.close()
        expect([n0, n1], Abort)
        for m in (n0, n1):
            m.send(Stopped())
        expect([n0, n1], Regroup)
        n0.send(Admitted())   # re-admission under way ...
        n1.close()            # ... when n1 is lost too
        expect([n0], Abort)
        n0.send(Stopped())
        (again,) = expect([n0], Regroup)
        assert again == Regroup(nodes=("n0",), lost=("n2", "n1"), recovery=2)
        assert g.admit([n0]) == 29001
    finally:
        g.close()


def test_on_straggler_replace_puts_the_slow_node_out_of_the_run_for_the_spare() -> None:
    """``on_straggler: replace`` with a spare standing by: n1's ranks' own work per step turns 1.5x the median;
    n1 is named, then put out as a lost node is: every node stops, and the survivors regroup with the spare in
    its place, the regroup naming it replaced. What n1 says after that counts for nothing."""
    g = Gang(min_nodes=0, max_recoveries=3, spares=1, on_straggler="replace")
    try:
        n0, n1, n2 = g.members
        for step in range(2, 40, 2):
            slow = 0.3 if step >= 20 else 0.2
            n0.send(Progress(at=float(step), steps=True, work=(RankWork(rank=0, step=step, steps=2, own_s=0.2, step_s=0.3),
                                                              RankWork(rank=1, step=step, steps=2, own_s=0.2, step_s=0.3))))
            n1.send(Progress(at=float(step), steps=True, work=(RankWork(rank=2, step=step, steps=2, own_s=slow, step_s=0.3),
                                                              RankWork(rank=3, step=step, steps=2, own_s=slow, step_s=0.3))))
            time.sleep(0.01)
        (a0, _, _) = expect([n0, n1, n2], Abort)
        assert a0.failure is not None and a0.failure.node == "n1" and "straggler" in a0.failure.reason
        n1.send(Failed(Failure("n1", 2, time.time(), "killed by the abort")))   # a put-out node's word: ignored
        n0.send(Stopped())
        (r0, r2) = expect([n0, n2], Regroup)
        assert r0 == r2 == Regroup(nodes=("n0", "n2"), lost=("n1",), recovery=1, replaced=("n1",))
        assert g.admit([n0, n2]) == 29001
    finally:
        g.close()


"""The run coordinator and its members over real loopback TCP: gang admission, fail fast, the verdict,
lost nodes, authentication. (The same code on the test bed's nodes: test_fail_fast.py.)"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Iterator
from typing import TypeVar

import pytest

from higgsfield.contract.failure import Failure
from higgsfield.contract.gang import (
    Abort,
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
    Message,
    Prepare,
    Ready,
    Stopped,
    Unadmitted,
    Welcome,
)
from higgsfield.node.gang import wire
from higgsfield.node.gang.coordinator import Coordinator
from higgsfield.node.gang.listener import listen
from higgsfield.node.gang.member import Inbox, Lost, Member

M = TypeVar("M")

TOKEN = "ab" * 32
NODES = ["n0", "n1", "n2"]


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Heartbeats every 0.2 s, lost after 1.5 s of silence (the real figures: 1 s and 5 s)."""
    monkeypatch.setattr(wire, "HEARTBEAT_S", 0.2)
    monkeypatch.setattr(wire, "LOST_S", 1.5)


class Run:
    def __init__(self, nodes: list[str] = NODES, join_s: float = 60.0) -> None:
        self.sock = listen()
        self.port = self.sock.getsockname()[1]
        self.picked: list[int] = []
        self.coordinator = Coordinator(self.sock, token=TOKEN, run="r", nodes=nodes, pick_port=self._pick,
                                       join_s=join_s)
        self.coordinator.start()
        self.members: list[Member] = []
        self.inboxes: list[Inbox] = []

    def _pick(self) -> int:
        self.picked.append(29999)
        return 29999

    def join(self, rank: int, token: str = TOKEN) -> Member:
        inbox: Inbox = queue.Queue()
        m = Member("127.0.0.1", self.port, token=token, run="r", rank=rank, node=NODES[rank],
                   coordinator_node=NODES[0], inbox=inbox)
        m.connect(time.monotonic() + 10)
        m.start()
        self.members.append(m)
        self.inboxes.append(inbox)
        return m

    def close(self) -> None:
        for m in self.members:
            m.close()
        self.coordinator.close()


@pytest.fixture()
def run() -> Iterator[Run]:
    r = Run()
    yield r
    r.close()


def _next(inbox: Inbox, timeout: float = 5.0) -> Message | Lost | None:
    try:
        return inbox.get(timeout=timeout)
    except queue.Empty:
        return None


def _expect(run: Run, kind: type[M], timeout: float = 5.0) -> list[M]:
    got = [_next(inbox, timeout) for inbox in run.inboxes]
    assert all(isinstance(m, kind) for m in got), got
    return [m for m in got if isinstance(m, kind)]


def _failure(m: Message | Lost | None) -> Failure:
    """The failure an abort (or the member's Lost) names."""
    assert isinstance(m, (Abort, FinalVerdict, Lost)) and m.verdict.failure is not None, m
    return m.verdict.failure


def test_go_comes_only_when_every_node_is_admitted_and_has_committed(run: Run) -> None:
    members = [run.join(i) for i in range(3)]
    members[0].send(Admitted())
    members[1].send(Admitted())
    assert _next(run.inboxes[0], 0.5) is None            # n2 is still queued: nobody prepares
    members[2].send(Admitted())
    _expect(run, Prepare)
    members[0].send(Ready())
    members[1].send(Ready())
    members[2].send(Unadmitted())                         # an older run took n2's slots meanwhile
    _expect(run, Cancel)
    assert run.picked == []                               # no port was chosen, no node started
    members[2].send(Admitted())
    _expect(run, Prepare)
    for m in members:
        m.send(Ready())
    assert {m.port for m in _expect(run, Go)} == {29999} and run.picked == [29999]
    for m in members:
        m.send(Finished())
    _expect(run, Bye)
    assert run.coordinator.wait(5)


def test_the_first_failure_by_its_own_time_is_every_node_s_verdict(run: Run) -> None:
    members = [run.join(i) for i in range(3)]
    t = time.time()
    # n1 reports first, but n2's rank failed earlier: n1's ranks failed because n2's died
    # (the failure's node is the sender's, whatever the report says)
    members[1].send(Failed(Failure(None, 1, t, "rank 1: connection reset")))
    abort = _expect(run, Abort)
    assert {_failure(a).node for a in abort} == {"n1"}
    members[2].send(Failed(Failure("elsewhere", 2, t - 0.5, "rank 2: RuntimeError", ["x"])))
    members[0].send(Stopped())
    verdict = _expect(run, FinalVerdict)
    assert [(_failure(v).node, _failure(v).rank) for v in verdict] == [("n2", 2)] * 3
    assert all(m.verdict_final.is_set() and m.verdict is not None and m.verdict.failure is not None
               and m.verdict.failure.tail == ["x"] for m in members)
    _expect(run, Bye)


def test_a_silent_node_is_lost_within_seconds_and_the_others_abort(run: Run) -> None:
    members = [run.join(i) for i in range(2)]
    # n2 authenticates, then never says another word (a frozen node: its socket stays open)
    raw = socket.create_connection(("127.0.0.1", run.port))
    chan = wire.Channel(raw)
    challenge = chan.recv(5)
    assert isinstance(challenge, Challenge)
    chan.send(Hello(2, "n2", "nm", wire.mac(TOKEN, "member", "r", 2, challenge.nonce, "nm")))
    assert isinstance(chan.recv(5), Welcome)
    t0 = time.monotonic()
    aborts = [_next(inbox, 10) for inbox in run.inboxes]
    took = time.monotonic() - t0
    assert all(isinstance(a, Abort) and _failure(a).node == "n2" and _failure(a).lost for a in aborts)
    assert "no heartbeat" in _failure(aborts[0]).reason and took < wire.LOST_S + 2
    for m in members:
        m.send(Stopped())
    assert run.coordinator.wait(5)
    raw.close()
    del members


def test_a_node_whose_connection_drops_is_lost_at_once(run: Run) -> None:
    members = [run.join(i) for i in range(3)]
    members[2]._chan.sock.close()   # type: ignore[union-attr]  # the node died: the kernel closes its socket
    aborts = [_next(run.inboxes[i], 3) for i in (0, 1)]
    assert all(_failure(a).node == "n2" and "was lost" in _failure(a).reason for a in aborts)


def test_members_see_the_coordinator_vanish(run: Run) -> None:
    run.join(1)
    run.coordinator.close()          # node 0 died
    lost = _next(run.inboxes[0], 5)
    assert isinstance(lost, Lost) and _failure(lost).node == "n0"
    assert "coordinator is gone" in _failure(lost).reason


def test_a_kill_on_one_node_stops_the_others_as_killed(run: Run) -> None:
    members = [run.join(i) for i in range(3)]
    members[1].send(Killed())
    assert all(a.kind == "killed" and a.node == "n1" for a in _expect(run, Abort))


def test_a_wrong_token_or_a_stranger_never_joins(run: Run) -> None:
    with pytest.raises(wire.WireError, match="refused"):
        run.join(1, token="cd" * 32)
    junk = socket.create_connection(("127.0.0.1", run.port))
    junk.sendall(b'{"t": "hello", "rank": 0, "nonce": "x", "mac": "00"}\n')
    junk.settimeout(5)
    data = b""
    while True:  # the challenge, then the door closes
        chunk = junk.recv(4096)
        if not chunk:
            break
        data += chunk
    assert b"welcome" not in data
    junk.close()
    members = [run.join(i) for i in range(3)]   # the real nodes still join, rank 1 included
    for m in members:
        m.send(Admitted())
    _expect(run, Prepare)
    # and a second connection for a rank that joined is refused (no one takes over a node)
    with pytest.raises(wire.WireError):
        run.join(1)


def test_a_node_that_never_joins_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    r = Run(join_s=1.0)
    try:
        r.join(0)
        r.join(1)
        aborts = [_next(inbox, 5) for inbox in r.inboxes]
        assert all(_failure(a).node == "n2" and "never joined" in _failure(a).reason for a in aborts)
    finally:
        r.close()


def test_many_runs_at_once_get_distinct_coordinator_ports() -> None:
    socks = [listen() for _ in range(20)]
    try:
        assert len({s.getsockname()[1] for s in socks}) == 20
    finally:
        for s in socks:
            s.close()


def test_the_wire_decodes_each_line_and_names_what_is_not_a_message() -> None:
    reader = wire.LineReader()
    assert reader.feed(b'{"t": "hb"}\n{"t": "go", "port": 1}\n{"t"') == [Heartbeat(), Go(1)]
    assert reader.feed(b': "go", "port": 2}\n') == [Go(2)]
    for bad, why in ((b"[1]\n", "a message is a list, not an object"), (b"nope\n", "not JSON"),
                     (b'{"x": 1}\n', "unknown kind"), (b"[" * 100_000 + b"\n", "not JSON"),
                     (b'{"t": "go", "port": "1"}\n', "'port' must be an integer, not a string")):
        [got] = wire.LineReader().feed(bad)
        assert isinstance(got, wire.Undecoded) and why in got.why, got
    [failed] = wire.LineReader().feed(b'{"t": "failed", "failure": {"rank": "x"}}\n')
    assert isinstance(failed, wire.Undecoded) and failed.claims is Failed
    with pytest.raises(wire.WireError, match="too long"):
        wire.LineReader().feed(b"x" * (wire.MAX_LINE + 1))
    assert threading.active_count() >= 1

"""A malformed line on the gang wire, from an authenticated peer: logged with the node that sent it, dropped,
and the run goes on (a real coordinator and real members on loopback, with the real HMAC handshake)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import pytest

from higgsfield.contract.gang import Abort, Admitted, Go, Heartbeat, Message, Prepare, Ready
from higgsfield.node.gang import wire
from higgsfield.node.gang.coordinator import Coordinator
from higgsfield.node.gang.listener import listen
from higgsfield.node.gang.member import Inbox, Lost, Member

pytestmark = pytest.mark.timeout(60)

TOKEN = "ef" * 32
NODES = ["n0", "n1"]

# What an authenticated peer may send that this node cannot read: each must be logged and dropped.
MALFORMED = [
    (b'{"t": "progress", "at": "soon", "steps": true}', "'at' must be a number, not a string"),   # a wrong type
    (b'{"t": "from-a-newer-node", "x": 1}', "unknown kind 'from-a-newer-node'"),                 # an unknown kind
    (b"not json at all", "not JSON"),
    (b'["hb"]', "a message is a list, not an object"),
    (b"[" * 50_000, "not JSON"),                                                                  # nested too deep
]


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """No heartbeats while a test runs (so a planted line never interleaves with one), none lost either."""
    monkeypatch.setattr(wire, "HEARTBEAT_S", 60.0)
    monkeypatch.setattr(wire, "LOST_S", 120.0)


class Said:
    """A ``say`` that keeps its lines (called from the coordinator's and the members' threads)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, line: str) -> None:
        with self._lock:
            self.lines.append(line)

    def naming(self, *words: str) -> list[str]:
        with self._lock:
            return [line for line in self.lines if all(w in line for w in words)]


class Gang:
    def __init__(self) -> None:
        self.coordinator_said, self.member_said = Said(), Said()
        sock = listen()
        self.coordinator = Coordinator(sock, token=TOKEN, run="r", nodes=NODES, pick_port=lambda: 29999,
                                       say=self.coordinator_said)
        self.coordinator.start()
        self.members: list[Member] = []
        self.inboxes: list[Inbox] = []
        for rank, node in enumerate(NODES):
            inbox: Inbox = queue.Queue()
            m = Member("127.0.0.1", sock.getsockname()[1], token=TOKEN, run="r", rank=rank, node=node,
                       coordinator_node=NODES[0], inbox=inbox, say=self.member_said)
            m.connect(time.monotonic() + 10)
            m.start()
            self.members.append(m)
            self.inboxes.append(inbox)

    def next(self, rank: int, timeout: float = 5.0) -> Message | Lost | None:
        """The next message but heartbeats, None if none came within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.inboxes[rank].get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if not isinstance(msg, Heartbeat):
                return msg

    def close(self) -> None:
        for m in self.members:
            m.close()
        self.coordinator.close()


@pytest.fixture()
def gang() -> Iterator[Gang]:
    g = Gang()
    yield g
    g.close()


def _plant(member: Member, line: bytes) -> None:
    """Send raw bytes on an authenticated member's connection (as a peer of another release, or a damaged one)."""
    chan = member._chan
    assert chan is not None
    with chan._lock:
        chan.sock.sendall(line + b"\n")


def test_a_malformed_message_from_a_member_is_logged_naming_it_and_the_coordinator_serves_on(gang: Gang) -> None:
    for line, _ in MALFORMED:
        _plant(gang.members[1], line)
    _plant(gang.members[1], b'{"t": "go", "port": 1}')        # a coordinator's message, from a member
    for m in gang.members:
        m.send(Admitted())
    assert all(isinstance(gang.next(r), Prepare) for r in range(2))    # admission went on, n1 still in it
    for line, why in MALFORMED:
        assert gang.coordinator_said.naming("node n1", "did not decode", why), (line[:40], gang.coordinator_said.lines)
    assert gang.coordinator_said.naming("node n1", "'go'", "dropped")
    for m in gang.members:
        m.send(Ready())
    assert [getattr(gang.next(r), "port", None) for r in range(2)] == [29999, 29999]
    assert not gang.coordinator.done.is_set() and gang.coordinator.abort_kind is None
    assert sorted(gang.coordinator.members) == [0, 1]


def test_a_malformed_message_from_the_coordinator_is_logged_and_the_member_serves_on(gang: Gang) -> None:
    for m in gang.members:
        m.send(Admitted())
    assert isinstance(gang.next(1), Prepare)
    conn = gang.coordinator.members[1]
    for line, _ in MALFORMED:                  # sent on the coordinator's end of n1's connection
        conn.sock.sendall(line + b"\n")
    conn.sock.sendall(wire.encode(Go(4242)))
    assert isinstance(gang.next(1), Go)        # n1's member read on: the next good message reached its supervisor
    for _, why in MALFORMED:
        assert gang.member_said.naming("coordinator (n0)", "did not decode", why), gang.member_said.lines


def test_a_verdict_from_the_coordinator_that_does_not_decode_still_ends_the_run(gang: Gang) -> None:
    gang.coordinator.members[1].sock.sendall(b'{"t": "abort", "kind": "failed"}\n')   # no failure
    msg = gang.next(1)
    assert isinstance(msg, Abort) and msg.failure is not None and msg.failure.node == "n0"
    assert "the run's coordinator sent a verdict that did not decode" in msg.failure.reason
    assert gang.members[1].verdict == msg.verdict


def test_a_failure_report_that_does_not_decode_still_fails_its_node(gang: Gang) -> None:
    _plant(gang.members[1], b'{"t": "failed", "failure": {"rank": "three"}}')
    aborts = [gang.next(r) for r in range(2)]
    assert all(isinstance(a, Abort) and a.failure is not None and a.failure.node == "n1"
               and "its report did not decode" in a.failure.reason for a in aborts), aborts

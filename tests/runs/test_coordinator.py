"""The run coordinator and its members over real loopback TCP: gang admission, fail fast, the verdict,
lost nodes, authentication. (The same code on the test bed's nodes: test_fail_fast.py.)"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from higgsfield.node.gang import wire
from higgsfield.node.gang.coordinator import Coordinator, listen
from higgsfield.node.gang.member import Member

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
        self.inboxes: list[queue.Queue[dict[str, Any]]] = []

    def _pick(self) -> int:
        self.picked.append(29999)
        return 29999

    def join(self, rank: int, token: str = TOKEN) -> Member:
        inbox: queue.Queue[dict[str, Any]] = queue.Queue()
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


def _next(inbox: queue.Queue[dict[str, Any]], timeout: float = 5.0) -> dict[str, Any] | None:
    try:
        return inbox.get(timeout=timeout)
    except queue.Empty:
        return None


def _expect(run: Run, t: str, timeout: float = 5.0) -> list[dict[str, Any]]:
    got = [_next(inbox, timeout) for inbox in run.inboxes]
    assert [m and m["t"] for m in got] == [t] * len(got), got
    return [m for m in got if m]


def test_go_comes_only_when_every_node_is_admitted_and_has_committed(run: Run) -> None:
    members = [run.join(i) for i in range(3)]
    members[0].send("admitted")
    members[1].send("admitted")
    assert _next(run.inboxes[0], 0.5) is None            # n2 is still queued: nobody prepares
    members[2].send("admitted")
    _expect(run, "prepare")
    members[0].send("ready")
    members[1].send("ready")
    members[2].send("unadmitted")                         # an older run took n2's slots meanwhile
    _expect(run, "cancel")
    assert run.picked == []                               # no port was chosen, no node started
    members[2].send("admitted")
    _expect(run, "prepare")
    for m in members:
        m.send("ready")
    assert {m["port"] for m in _expect(run, "go")} == {29999} and run.picked == [29999]
    for m in members:
        m.send("finished")
    _expect(run, "bye")
    assert run.coordinator.wait(5)


def test_the_first_failure_by_its_own_time_is_every_node_s_verdict(run: Run) -> None:
    members = [run.join(i) for i in range(3)]
    t = time.time()
    # n1 reports first, but n2's rank failed earlier: n1's ranks failed because n2's died
    members[1].send("failed", failure={"rank": 1, "at": t, "reason": "rank 1: connection reset", "tail": []})
    abort = _expect(run, "abort")
    assert {a["verdict"].failure.node for a in abort} == {"n1"}
    members[2].send("failed", failure={"rank": 2, "at": t - 0.5, "reason": "rank 2: RuntimeError", "tail": ["x"]})
    members[0].send("stopped")
    verdict = _expect(run, "verdict")
    assert [(v["verdict"].failure.node, v["verdict"].failure.rank) for v in verdict] == [("n2", 2)] * 3
    assert all(m.verdict_final.is_set() and m.verdict is not None and m.verdict.failure is not None
               and m.verdict.failure.tail == ["x"] for m in members)
    _expect(run, "bye")


def test_a_silent_node_is_lost_within_seconds_and_the_others_abort(run: Run) -> None:
    members = [run.join(i) for i in range(2)]
    # n2 authenticates, then never says another word (a frozen node: its socket stays open)
    raw = socket.create_connection(("127.0.0.1", run.port))
    chan = wire.Channel(raw)
    challenge = chan.recv(5)
    assert challenge and challenge["t"] == "challenge"
    chan.send({"t": "hello", "rank": 2, "node": "n2", "nonce": "nm",
               "mac": wire.mac(TOKEN, "member", "r", 2, challenge["nonce"], "nm")})
    assert (chan.recv(5) or {}).get("t") == "welcome"
    t0 = time.monotonic()
    aborts = [_next(inbox, 10) for inbox in run.inboxes]
    took = time.monotonic() - t0
    assert all(a and a["t"] == "abort" and a["verdict"].failure.node == "n2" and a["verdict"].failure.lost for a in aborts)
    assert "no heartbeat" in aborts[0]["verdict"].failure.reason and took < wire.LOST_S + 2   # type: ignore[index]
    for m in members:
        m.send("stopped")
    assert run.coordinator.wait(5)
    raw.close()
    del members


def test_a_node_whose_connection_drops_is_lost_at_once(run: Run) -> None:
    members = [run.join(i) for i in range(3)]
    members[2]._chan.sock.close()   # type: ignore[union-attr]  # the node died: the kernel closes its socket
    aborts = [_next(run.inboxes[i], 3) for i in (0, 1)]
    assert all(a and a["verdict"].failure.node == "n2" and "was lost" in a["verdict"].failure.reason for a in aborts)


def test_members_see_the_coordinator_vanish(run: Run) -> None:
    run.join(1)
    run.coordinator.close()          # node 0 died
    lost = _next(run.inboxes[0], 5)
    assert lost and lost["t"] == "lost" and lost["verdict"].failure.node == "n0"
    assert "coordinator is gone" in lost["verdict"].failure.reason


def test_a_kill_on_one_node_stops_the_others_as_killed(run: Run) -> None:
    members = [run.join(i) for i in range(3)]
    members[1].send("killed")
    assert all(a["verdict"].kind == "killed" and a["verdict"].node == "n1" for a in _expect(run, "abort"))


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
        m.send("admitted")
    _expect(run, "prepare")
    # and a second connection for a rank that joined is refused (no one takes over a node)
    with pytest.raises(wire.WireError):
        run.join(1)


def test_a_node_that_never_joins_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    r = Run(join_s=1.0)
    try:
        r.join(0)
        r.join(1)
        aborts = [_next(inbox, 5) for inbox in r.inboxes]
        assert all(a and a["verdict"].failure.node == "n2" and "never joined" in a["verdict"].failure.reason for a in aborts)
    finally:
        r.close()


def test_many_runs_at_once_get_distinct_coordinator_ports() -> None:
    socks = [listen() for _ in range(20)]
    try:
        assert len({s.getsockname()[1] for s in socks}) == 20
    finally:
        for s in socks:
            s.close()


def test_the_wire_refuses_what_is_not_a_message() -> None:
    reader = wire.LineReader()
    assert reader.feed(b'{"t": "hb"}\n{"t": "go", "port": 1}\n{"t"') == [{"t": "hb"}, {"t": "go", "port": 1}]
    for bad in (b"[1]\n", b"nope\n", b'{"x": 1}\n'):
        with pytest.raises(wire.WireError):
            wire.LineReader().feed(bad)
    with pytest.raises(wire.WireError, match="too long"):
        wire.LineReader().feed(b"x" * (wire.MAX_LINE + 1))
    assert threading.active_count() >= 1

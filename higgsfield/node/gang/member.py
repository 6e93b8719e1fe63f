"""A supervisor's side of its run's coordinator (see :mod:`higgsfield.node.gang.coordinator`).

It connects (retrying while node 0's supervisor starts), proves it holds the run's
token and checks that the coordinator does too (:mod:`higgsfield.node.gang.wire`), then
a thread keeps the connection: it sends a heartbeat every second and hands every
message from the coordinator to the supervisor's inbox (a ``queue.Queue``). When the
coordinator goes away (its connection drops, or it is silent for
:data:`~higgsfield.node.gang.wire.LOST_S` seconds: node 0 died, froze or is cut off),
the inbox gets :class:`Lost`, whose verdict's failure names node 0, and the supervisor
stops its part of the run. Every other message reaches the inbox as the
:mod:`higgsfield.contract.gang` dataclass it decoded to (heartbeats apart); one that did
not decode is logged and dropped, except an ``abort`` or ``verdict``, which still ends
the run, naming the coordinator. A ``regroup`` (the run goes on without a lost node) is
kept in :attr:`Member.regroup` and ends the wait for a verdict, as a verdict would; the members'
``standbys`` (where the next node would take a lost node 0's coordinator over) in :attr:`Member.standbys`.

Use::

    m = Member(host, port, token=..., run=..., rank=i, node=name, coordinator_node=nodes[0], inbox=q, say=say)
    m.connect(deadline=time.monotonic() + 120, should_stop=killed)
    m.start()
    m.send(Admitted())
    ... q.get() ...
    m.close()
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from tenacity import Retrying, retry_if_exception_type, wait_fixed

from higgsfield.contract.failure import Failure, Verdict
from higgsfield.contract.gang import (
    Abort,
    Bye,
    Challenge,
    FinalVerdict,
    Heartbeat,
    Hello,
    Message,
    Regroup,
    Standbys,
    Welcome,
)
from higgsfield.node.gang import wire
from higgsfield.node.gang.coordinator import lost_failure


@dataclass(frozen=True)
class Lost:
    """No wire message: the member's word to its supervisor that the coordinator is gone (node 0 lost)."""

    verdict: Verdict


Inbox: TypeAlias = queue.Queue[Message | Lost | None]
"""What a member hands its supervisor (None: nothing, a wake-up the supervisor may put itself)."""


class Member:
    def __init__(self, host: str, port: int, *, token: str, run: str, rank: int, node: str,
                 coordinator_node: str, inbox: Inbox, say: Callable[[str], None] = lambda _m: None) -> None:
        self.host, self.port = host, port
        self.token, self.run, self.rank, self.node = token, run, rank, node
        self.coordinator_node = coordinator_node
        self.inbox = inbox
        self.say = say
        self.verdict: Verdict | None = None       # the latest abort/verdict the coordinator sent
        self.verdict_final = threading.Event()           # set by "verdict" (or when the coordinator is gone)
        self.regroup: Regroup | None = None       # the run goes on on other nodes: set with verdict_final
        self.standbys: dict[str, int] = {}        # where each member would host the coordinator (node 0 lost)
        self._chan: wire.Channel | None = None
        self._closing = threading.Event()
        self._lost = False
        self._lose_lock = threading.Lock()
        self._last_rx_wall = time.time()
        self._thread = threading.Thread(target=self._loop, name="higgsfield-member", daemon=True)

    def connect(self, deadline: float, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Connect and authenticate; retries refused connections until ``deadline`` (monotonic).

        Raises :class:`~higgsfield.node.gang.wire.WireError` when the deadline passes, ``should_stop()``
        turns true, or the other end fails the handshake.
        """
        if should_stop():
            raise wire.WireError("stopped while connecting")
        # Node 0's supervisor may not listen yet: try every 0.5 s until the deadline (tenacity).
        dial = Retrying(stop=lambda _: should_stop() or time.monotonic() >= deadline, wait=wait_fixed(0.5),
                        retry=retry_if_exception_type(OSError), reraise=True)
        try:
            sock = dial(socket.create_connection, (self.host, self.port), timeout=5)
        except OSError as e:
            if should_stop():
                raise wire.WireError("stopped while connecting") from None
            raise wire.WireError(f"cannot reach the run's coordinator on {self.coordinator_node} "
                                 f"({self.host}:{self.port}): {e}") from None
        chan = wire.Channel(sock)
        try:
            challenge = chan.recv(timeout=wire.HANDSHAKE_S)
            if not isinstance(challenge, Challenge):
                raise wire.WireError("no challenge from the coordinator")
            mine = wire.nonce()
            chan.send(Hello(self.rank, self.node, mine,
                            wire.mac(self.token, "member", self.run, self.rank, challenge.nonce, mine)))
            try:
                welcome = chan.recv(timeout=wire.HANDSHAKE_S)
            except wire.WireError:
                welcome = None   # it hung up on the hello: it does not know this run's token, or this rank
            expected = wire.mac(self.token, "coordinator", self.run, self.rank, challenge.nonce, mine)
            if not isinstance(welcome, Welcome) or not wire.check(expected, welcome.mac):
                raise wire.WireError("the coordinator refused this node or failed to prove the run's token")
        except wire.WireError:
            chan.close()
            raise
        self._chan = chan
        self._last_rx_wall = time.time()

    def start(self) -> None:
        self._thread.start()

    @property
    def last_heard(self) -> float:
        """When (wall clock) the coordinator was last heard of."""
        return self._last_rx_wall

    @property
    def lost(self) -> bool:
        """Is the coordinator gone (its connection dropped or went silent), as opposed to having said its verdict?"""
        return self._lost

    def send(self, msg: Message) -> None:
        """Send a message; a broken connection is reported to the inbox as the coordinator lost."""
        if self._chan is None or self._lost:
            return
        try:
            self._chan.send(msg)
        except wire.WireError as e:
            self._lose(str(e))

    def close(self) -> None:
        self._closing.set()
        if self._chan is not None:
            self._chan.close()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        assert self._chan is not None
        last_rx = last_tx = time.monotonic()
        while not self._closing.is_set():
            now = time.monotonic()
            if now - last_tx >= wire.HEARTBEAT_S:
                last_tx = now
                self.send(Heartbeat())
            try:
                msg = self._chan.recv(timeout=0.25)
            except wire.WireError as e:
                if not self._closing.is_set():
                    self._lose(str(e))
                return
            if msg is None:
                if time.monotonic() - last_rx > wire.LOST_S:
                    self._lose(f"no heartbeat for {time.monotonic() - last_rx:.0f}s")
                    return
                continue
            last_rx, self._last_rx_wall = time.monotonic(), time.time()
            if isinstance(msg, wire.Undecoded):
                if msg.claims is not Abort and msg.claims is not FinalVerdict:
                    self.say(f"the run's coordinator ({self.coordinator_node}) sent a message that did not decode, "
                             f"dropped: {msg.why}")
                    continue
                # a verdict that does not decode still ends the run, naming the coordinator
                failure = Failure(self.coordinator_node, None, time.time(),
                                  f"the run's coordinator sent a verdict that did not decode: {msg.why}")
                msg = (FinalVerdict if msg.claims is FinalVerdict else Abort)("failed", failure)
            match msg:
                case Heartbeat():
                    continue
                case Standbys(ports=ports):
                    self.standbys = dict(ports)
                    continue
                case Abort() | FinalVerdict():
                    self.verdict = msg.verdict
                    if isinstance(msg, FinalVerdict):
                        self.verdict_final.set()
                case Regroup():
                    self.regroup = msg
                    self.verdict_final.set()
                case Bye():
                    self._closing.set()
                    self.verdict_final.set()
            self.inbox.put(msg)

    def _lose(self, why: str) -> None:
        with self._lose_lock:
            if self._lost or self._closing.is_set():
                return
            self._lost = True
        failure = lost_failure(self.coordinator_node, f"the run's coordinator is gone ({why})", self._last_rx_wall)
        if self.verdict is None:
            self.verdict = Verdict("failed", failure)
        self.verdict_final.set()
        self.inbox.put(Lost(Verdict("failed", failure)))
        if self._chan is not None:
            with contextlib.suppress(OSError):
                self._chan.close()

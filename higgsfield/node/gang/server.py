"""The server side of a run's gang wire: connections, the handshake, and who is a member.

:class:`~higgsfield.node.gang.coordinator.Coordinator` is one: it adds what the run's
members say and what it decides. Its own module because serving the wire (a selector
loop in a thread, the mutual HMAC handshake of :mod:`higgsfield.node.gang.wire`, a
member's connection dropping) is one concept apart from the run's rules. A subclass
says what a message means (``_handle``, ``_undecoded``), what a member joining or
vanishing does (``_joined``, ``_lost``) and what happens every turn (``_tick``).
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from higgsfield.contract.gang import Challenge, Hello, Message, Welcome
from higgsfield.node.gang import wire

__all__ = ["SEND_TIMEOUT_S", "Conn", "GangServer"]

SEND_TIMEOUT_S = 2.0


@dataclass
class Conn:
    sock: socket.socket
    reader: wire.LineReader = field(default_factory=lambda: wire.LineReader(wire.MAX_HELLO))
    nonce: str = field(default_factory=wire.nonce)
    opened: float = field(default_factory=time.monotonic)
    rank: int | None = None            # set once authenticated
    last_seen: float = field(default_factory=time.monotonic)
    last_seen_wall: float = field(default_factory=time.time)



class GangServer:
    """Serve one run's members (``nodes``: every member's name, by member rank) until ``done``."""

    def __init__(self, listener: socket.socket, *, token: str, run: str, nodes: list[str],
                 say: Callable[[str], None] = lambda _m: None) -> None:
        self.listener = listener
        self.token, self.run, self.nodes, self.say = token, run, nodes, say
        self.members: dict[int, Conn] = {}
        self.pending: list[Conn] = []
        self.joined: set[int] = set()
        self.done = threading.Event()
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._sel = selectors.DefaultSelector()
        self._thread = threading.Thread(target=self._loop, name="higgsfield-coordinator", daemon=True)

    # what a subclass says
    def _handle(self, rank: int, msg: Message) -> None:
        raise NotImplementedError

    def _undecoded(self, rank: int, bad: wire.Undecoded) -> None:
        raise NotImplementedError

    def _joined(self, conn: Conn) -> None:
        """A member joined (authenticated)."""

    def _lost(self, rank: int, why: str, last_seen_wall: float) -> None:
        """Member ``rank``'s connection dropped (or went silent: the subclass's ``_tick`` drops it)."""

    def _tick(self) -> None:
        """Every turn of the loop (at least every 0.2 s)."""

    # -- life --------------------------------------------------------------------------------------

    def start(self) -> None:
        self.listener.setblocking(False)
        self._sel.register(self.listener, selectors.EVENT_READ)
        self._thread.start()

    def wait(self, timeout: float) -> bool:
        """True once every member ended and the verdict is out."""
        return self.done.wait(timeout)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set() and not self.done.is_set():
                for key, _ in self._sel.select(timeout=0.2):
                    if key.fileobj is self.listener:
                        self._accept()
                    else:
                        self._readable(key.data)
                self._tick()
        except Exception as e:  # noqa: BLE001 - a coordinator bug must not leave the run hanging
            self.say(f"coordinator error: {type(e).__name__}: {e}")
        finally:
            for c in [*self.members.values(), *self.pending]:
                self._close(c)
            self._sel.close()
            self.listener.close()
            self.done.set()

    # -- connections -------------------------------------------------------------------------------

    def _accept(self) -> None:
        try:
            sock, _addr = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        sock.settimeout(SEND_TIMEOUT_S)
        conn = Conn(sock)
        if len(self.pending) >= 4 * len(self.nodes) + 8:  # a flood of strangers: keep the oldest waiting
            sock.close()
            return
        self.pending.append(conn)
        self._sel.register(sock, selectors.EVENT_READ, conn)
        self._send(conn, Challenge(conn.nonce))

    def _readable(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError, TimeoutError):
            return
        except OSError as e:
            self._drop(conn, f"connection lost ({e})")
            return
        if not data:
            self._drop(conn, "connection closed")
            return
        try:
            messages = conn.reader.feed(data)
        except wire.WireError as e:
            self._drop(conn, f"protocol error ({e})")
            return
        for msg in messages:
            if conn.rank is None:
                if not self._hello(conn, msg):
                    return
            else:
                conn.last_seen, conn.last_seen_wall = time.monotonic(), time.time()
                if isinstance(msg, wire.Undecoded):
                    self._undecoded(conn.rank, msg)
                else:
                    self._handle(conn.rank, msg)

    def _hello(self, conn: Conn, msg: wire.Received) -> bool:
        if not (isinstance(msg, Hello) and 0 <= msg.rank < len(self.nodes) and msg.rank not in self.joined
                and wire.check(wire.mac(self.token, "member", self.run, msg.rank, conn.nonce, msg.nonce), msg.mac)):
            # a stranger, a wrong token, or a second connection for a rank: never a member
            self.pending.remove(conn)
            self._close(conn)
            return False
        rank = msg.rank
        self.pending.remove(conn)
        conn.rank = rank
        conn.reader.limit = wire.MAX_LINE
        conn.last_seen, conn.last_seen_wall = time.monotonic(), time.time()
        self.members[rank] = conn
        self.joined.add(rank)
        self._send(conn, Welcome(wire.mac(self.token, "coordinator", self.run, rank, conn.nonce, msg.nonce)))
        self._joined(conn)
        return True

    def _drop(self, conn: Conn, why: str) -> None:
        if conn in self.pending:
            self.pending.remove(conn)
        self._close(conn)
        rank = conn.rank
        if rank is None or self.members.get(rank) is not conn:
            return
        del self.members[rank]
        self._lost(rank, why, conn.last_seen_wall)

    def _close(self, conn: Conn) -> None:
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        try:
            conn.sock.close()
        except OSError:
            pass

    def _send(self, conn: Conn, msg: Message) -> None:
        try:
            conn.sock.sendall(wire.encode(msg))
        except OSError as e:
            self._drop(conn, f"connection lost ({e})")

    def broadcast(self, msg: Message) -> None:
        for conn in list(self.members.values()):
            self._send(conn, msg)

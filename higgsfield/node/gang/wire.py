"""The run coordinator's wire: newline-delimited JSON over TCP, with a mutual HMAC handshake.

One connection per node of a run, from that node's supervisor (a *member*, see
:mod:`higgsfield.node.gang.member`) to the run's *coordinator* on node 0 (see
:mod:`higgsfield.node.gang.coordinator`). Every message is one JSON object on one
line, a dataclass of :mod:`higgsfield.contract.gang` (its kind in ``"t"``, its fields
the other keys): :func:`encode` writes one, :class:`LineReader` decodes each line once.
A line that is not a message this node reads (not JSON, not an object, an unknown kind,
a field of the wrong type) comes out as :class:`Undecoded`, which the receiver logs with
the node that sent it and drops; only a line over the length limit breaks the connection.

The handshake proves that both ends hold the run's token (32 random bytes the
control side made for this run; it reaches each supervisor on its stdin, never a
command line or a file), without sending it::

    coordinator -> Challenge(nonce=NS)
    member      -> Hello(rank=R, node=NAME, nonce=NM, mac=mac(token, "member", run, R, NS, NM))
    coordinator -> Welcome(mac=mac(token, "coordinator", run, R, NS, NM))

Both sides compare with ``hmac.compare_digest``. A stranger that connects learns
nothing and can neither join nor abort a run; a stranger listening on the port
cannot impersonate the coordinator either. The messages after it:
:mod:`higgsfield.contract.gang`.

Only the standard library: the supervisor and the coordinator are small.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import threading
from dataclasses import dataclass
from typing import TypeAlias

from higgsfield.contract import codec
from higgsfield.contract.decode import DecodeError, loads
from higgsfield.contract.gang import KINDS, Message, claimed_kind

MAX_LINE = 1 << 24          # a longer line is a protocol error (a node's ranks' stacks stay well below)
MAX_HELLO = 1 << 16         # before the handshake: a stranger's line is never longer than this
HEARTBEAT_S = 1.0           # both sides send at least this often
LOST_S = 5.0                # silence after which the other side counts as lost
HANDSHAKE_S = 10.0          # a connection that has not authenticated by then is dropped
ABORT_GRACE_S = 2.0         # a member told to abort: SIGTERM to SIGKILL of its ranks (nothing to save)


class WireError(Exception):
    """A peer broke the protocol, failed authentication or went away."""


def nonce() -> str:
    return secrets.token_hex(16)


def mac(token: str, role: str, run: str, rank: int, ns: str, nm: str) -> str:
    """HMAC-SHA256 of the handshake's fields under the run's token (hex)."""
    msg = "|".join([role, run, str(rank), ns, nm]).encode()
    return hmac.new(token.encode(), msg, hashlib.sha256).hexdigest()


def check(expected: str, given: object) -> bool:
    return isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode())


@dataclass(frozen=True)
class Undecoded:
    """A line that is no message this node reads: ``why`` in one line, and the kind it ``claims`` to be
    when that is one this node knows (a member's ``failed`` that does not decode still fails its node)."""

    why: str
    claims: type[Message] | None = None


Received: TypeAlias = Message | Undecoded


def encode(msg: Message) -> bytes:
    return json.dumps(codec.encode(msg), separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> Received:
    """One line as the message it holds, or :class:`Undecoded` saying why not (never an exception)."""
    try:
        data = loads(line)
    except DecodeError as e:
        return Undecoded(str(e))
    try:
        return codec.decode_tagged(KINDS, data)
    except DecodeError as e:
        return Undecoded(str(e), claimed_kind(data))


class LineReader:
    """Splits a socket's bytes into lines and decodes each (:func:`decode`)."""

    def __init__(self, limit: int = MAX_LINE) -> None:
        self._buf = b""
        self.limit = limit

    def feed(self, data: bytes) -> list[Received]:
        """The whole lines ``data`` completes; WireError when a line is over the limit."""
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        if len(self._buf) > self.limit or any(len(line) > self.limit for line in lines):
            raise WireError("message too long")
        return [decode(line) for line in lines if line.strip()]


class Channel:
    """A connected socket that sends whole messages (thread-safe) and reads them with a deadline."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._reader = LineReader()
        self._pending: list[Received] = []
        self._lock = threading.Lock()

    def send(self, msg: Message) -> None:
        data = encode(msg)
        with self._lock:
            try:
                self.sock.sendall(data)
            except OSError as e:
                raise WireError(f"send failed: {e}") from None

    def recv(self, timeout: float) -> Received | None:
        """The next message, None if none came within ``timeout``; WireError when the peer closed."""
        if self._pending:
            return self._pending.pop(0)
        try:
            self.sock.settimeout(timeout)
            data = self.sock.recv(65536)
        except TimeoutError:
            return None
        except OSError as e:
            raise WireError(f"connection lost: {e}") from None
        if not data:
            raise WireError("connection closed")
        self._pending.extend(self._reader.feed(data))
        return self._pending.pop(0) if self._pending else None

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

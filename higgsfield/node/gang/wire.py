"""The run coordinator's wire: newline-delimited JSON over TCP, with a mutual HMAC handshake.

One connection per node of a run, from that node's supervisor (a *member*, see
:mod:`higgsfield.node.gang.member`) to the run's *coordinator* on node 0 (see
:mod:`higgsfield.node.gang.coordinator`). Every message is one JSON object on one
line, with its type in ``"t"``.

The handshake proves that both ends hold the run's token (32 random bytes the
control side made for this run; it reaches each supervisor on its stdin, never a
command line or a file), without sending it::

    coordinator -> {"t": "challenge", "nonce": NS}
    member      -> {"t": "hello", "rank": R, "node": NAME, "nonce": NM, "mac": mac(token, "member", run, R, NS, NM)}
    coordinator -> {"t": "welcome", "mac": mac(token, "coordinator", run, R, NS, NM)}

Both sides compare with ``hmac.compare_digest``. A stranger that connects learns
nothing and can neither join nor abort a run; a stranger listening on the port
cannot impersonate the coordinator either.

Messages after the handshake (member -> coordinator):
``hb``; ``admitted`` (this node holds its slots); ``unadmitted`` (it lost them to an
older run); ``ready`` (slots committed after ``prepare``); ``finished`` (torchrun
exited 0); ``failed`` {failure}; ``killed``; ``stopped`` (it stopped after an abort);
``progress`` {at, steps} (its ranks progressed: a step, or else output); ``stacks``
{ranks: [RankStacks dicts]} (the answer to ``stall``).
Coordinator -> member: ``hb``; ``prepare``; ``cancel``; ``go`` {port}; ``abort``
{kind, failure}; ``verdict`` {kind, failure}; ``bye``; ``stall`` (take your ranks'
stacks); ``stalled`` {diagnosis, at}; ``progressing`` (a waited-out stall ended);
``restart`` (kill your workers: torchrun restarts them).

Only the standard library: the supervisor and the coordinator are small.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import threading
from typing import Any

MAX_LINE = 1 << 24          # a longer line is a protocol error (a node's ranks' stacks stay well below)
MAX_HELLO = 1 << 16         # before the handshake: a stranger's line is never longer than this
HEARTBEAT_S = 1.0           # both sides send at least this often
LOST_S = 5.0                # silence after which the other side counts as lost
HANDSHAKE_S = 10.0          # a connection that has not authenticated by then is dropped


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


def encode(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


class LineReader:
    """Splits a socket's bytes into JSON messages (a dict per line)."""

    def __init__(self, limit: int = MAX_LINE) -> None:
        self._buf = b""
        self.limit = limit

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        if len(self._buf) > self.limit or any(len(line) > self.limit for line in lines):
            raise WireError("message too long")
        out = []
        for line in lines:
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                raise WireError("not JSON") from None
            if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
                raise WireError("not a message")
            out.append(msg)
        return out


class Channel:
    """A connected socket that sends whole messages (thread-safe) and reads them with a deadline."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._reader = LineReader()
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def send(self, msg: dict[str, Any]) -> None:
        data = encode(msg)
        with self._lock:
            try:
                self.sock.sendall(data)
            except OSError as e:
                raise WireError(f"send failed: {e}") from None

    def recv(self, timeout: float) -> dict[str, Any] | None:
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

"""Node to node copies of data objects: one node serves, another fetches, over TCP, no shell between them.

The control side starts ``invoker data serve`` on a node that holds the objects and
``invoker data fetch`` on one that lacks them, and gives both the same fresh token on SSH stdin
(never a command line or a file). The connection is authenticated as the run's gang wire is
(:mod:`higgsfield.node.gang.wire`: the same HMAC handshake, the same messages of
:mod:`higgsfield.contract.gang`), with role names of its own so a data token never opens a run::

    server  -> Challenge(nonce=NS)
    fetcher -> Hello(rank=0, node="data", nonce=NM, mac=mac(token, "data-fetch", "data", 0, NS, NM))
    server  -> Welcome(mac=mac(token, "data-serve", "data", 0, NS, NM))
    fetcher -> Want(shas)
    server  -> ObjectHeader line + bytes, for each object, then closes

The fetcher stores each object as :meth:`~higgsfield.node.data.store.Store.receive` does for the
laptop's stream (verified against its sha256, renamed into place), so a cut copy resumes.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import time
from collections.abc import Callable

from higgsfield.contract import codec
from higgsfield.contract.data import (
    DataError,
    FetchRequest,
    ObjectHeader,
    PutReply,
    ServeReady,
    ServeRequest,
    Want,
)
from higgsfield.contract.decode import DecodeError, loads
from higgsfield.contract.gang import Challenge, Hello, Welcome
from higgsfield.node.data.store import Store
from higgsfield.node.gang.wire import MAX_HELLO, check, mac, nonce

ACCEPT_S = 600.0       # a server nobody fetches from goes away after this
IO_S = 120.0           # silence on an established copy after which it is given up
SERVE_ROLE, FETCH_ROLE, RUN = "data-serve", "data-fetch", "data"
WAIT_POLL_S = 0.05     # how often a waiting server looks for the objects on their way to it
KEEPALIVE_S = 10.0     # a waiting server's empty line, so the fetcher's IO_S is only a dead peer's
LOOKAHEAD = 256        # objects a waiting server looks past the first one not here yet


class Stopped(DataError):
    """A waiting server's push is gone: the server ends (not just this connection)."""


def _send(sock: socket.socket, msg: object) -> None:
    sock.sendall(json.dumps(codec.encode(msg), separators=(",", ":")).encode() + b"\n")


def _recv_line(f: object, what: str, cls: type) -> object:
    line = f.readline(MAX_HELLO * 16)   # type: ignore[attr-defined]
    if not line:
        raise DataError(f"the peer closed the connection before its {what}")
    try:
        return codec.decode(cls, loads(line))
    except DecodeError as e:
        raise DataError(f"the peer's {what} does not decode: {e}") from None


def serve(store: Store, req: ServeRequest, *, ready: Callable[[ServeReady], None],
          stopped: Callable[[float], bool] | None = None) -> int:
    """Listen on a free port, say it (``ready``), serve ``req.clients`` authenticated fetchers; objects sent.

    With ``req.wait`` an object this node does not hold yet is waited for (it is on its way here), and
    ``stopped(seconds)`` is asked while waiting: True (the push that started this server is gone: its
    SSH channel closed) ends the wait with a DataError instead of a server left behind."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", 0))   # noqa: S104 (the peers are the other nodes; the token keeps strangers out)
    listener.listen(8)
    listener.settimeout(ACCEPT_S)
    ready(ServeReady(port=listener.getsockname()[1]))
    served = sent = 0
    try:
        while served < req.clients:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                raise DataError(f"no peer came to fetch within {ACCEPT_S:.0f}s") from None
            with conn:
                conn.settimeout(IO_S)
                try:
                    sent += _serve_one(store, req, conn, stopped)
                    served += 1
                except Stopped:
                    raise
                except (DataError, OSError) as e:   # a stranger, or a peer gone: the next may be the one
                    print(f"data serve: {e}", file=sys.stderr, flush=True)
                finally:   # the reader made of it keeps the socket open past ``with``: close it for the peer
                    with contextlib.suppress(OSError):
                        conn.shutdown(socket.SHUT_RDWR)
    finally:
        listener.close()
    return sent


def _serve_one(store: Store, req: ServeRequest, conn: socket.socket,
               stopped: Callable[[float], bool] | None) -> int:
    ns = nonce()
    _send(conn, Challenge(nonce=ns))
    f = conn.makefile("rb")
    hello = _recv_line(f, "hello", Hello)
    assert isinstance(hello, Hello)
    if not check(mac(req.token, FETCH_ROLE, RUN, 0, ns, hello.nonce), hello.mac):
        raise DataError("a peer failed the handshake (wrong token)")
    _send(conn, Welcome(mac=mac(req.token, SERVE_ROLE, RUN, 0, ns, hello.nonce)))
    want = _recv_line(f, "request", Want)
    assert isinstance(want, Want)
    pending = list(dict.fromkeys(want.shas))
    sent = 0
    quiet = time.monotonic()
    while pending:
        left = []
        misses = 0
        for sha in pending:   # in order, skipping what has not arrived yet (a few batches arrive at once)
            if misses < LOOKAHEAD and store.has(sha):
                _send_object(store, sha, conn)
                sent += 1
            else:
                misses += 1
                left.append(sha)
        if not req.wait and left:
            raise DataError(f"asked for object {left[0][:12]}, which this node does not hold")
        if len(left) == len(pending):   # nothing new here: wait, keep the connection alive, heed a stop
            if stopped is not None and stopped(WAIT_POLL_S):
                raise Stopped("the push that started this server stopped")
            if stopped is None:
                time.sleep(WAIT_POLL_S)
            if time.monotonic() - quiet > KEEPALIVE_S:
                conn.sendall(b"\n")   # an empty line: the fetcher's receive skips it
                quiet = time.monotonic()
        else:
            quiet = time.monotonic()
        pending = left
    conn.shutdown(socket.SHUT_WR)
    return sent


def _send_object(store: Store, sha: str, conn: socket.socket) -> None:
    with store.open_object(sha) as obj:
        size = obj.seek(0, 2)
        obj.seek(0)
        conn.sendall(json.dumps(codec.encode(ObjectHeader(sha256=sha, size=size))).encode() + b"\n")
        conn.sendfile(obj)


def _every(seconds: float, say: Callable[[PutReply], None] | None) -> Callable[[PutReply], None] | None:
    """``say``, called at most once every ``seconds``."""
    if say is None:
        return None
    last = [0.0]

    def maybe(r: PutReply) -> None:
        if time.monotonic() - last[0] >= seconds:
            last[0] = time.monotonic()
            say(r)

    return maybe


def fetch(store: Store, req: FetchRequest, *, progress: Callable[[PutReply], None] | None = None) -> PutReply:
    """Take ``req.shas`` from the serving peer into ``store``, each verified; DataError when it cannot."""
    want = store.missing(req.shas)
    if not want:
        return PutReply()
    try:
        conn = socket.create_connection((req.host, req.port), timeout=IO_S)
    except OSError as e:
        raise DataError(f"cannot reach the serving node at {req.host}:{req.port}: {e.strerror or e}") from None
    with conn:
        f = conn.makefile("rb")
        ch = _recv_line(f, "challenge", Challenge)
        assert isinstance(ch, Challenge)
        nm = nonce()
        _send(conn, Hello(rank=0, node="data", nonce=nm, mac=mac(req.token, FETCH_ROLE, RUN, 0, ch.nonce, nm)))
        welcome = _recv_line(f, "welcome", Welcome)
        assert isinstance(welcome, Welcome)
        if not check(mac(req.token, SERVE_ROLE, RUN, 0, ch.nonce, nm), welcome.mac):
            raise DataError(f"the node at {req.host}:{req.port} failed the handshake: not the serving node")
        _send(conn, Want(shas=want))
        got = store.receive(f, progress=_every(0.5, progress))
    left = store.missing(want)
    if left:
        raise DataError(f"the serving node sent {len(want) - len(left)} of {len(want)} objects: push again")
    return got

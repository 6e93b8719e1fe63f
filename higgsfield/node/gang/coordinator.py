"""A run's coordinator: a small TCP service on node 0 that gangs its nodes together.

Node 0's supervisor hosts it, in a thread, on a port its ``invoker start`` bound
(so the port is known to the control side before any peer starts). Every node's
supervisor, node 0's included, joins as a *member* (:mod:`higgsfield.node.gang.member`)
over the authenticated wire of :mod:`higgsfield.node.gang.wire`. The coordinator
decides three things for the run, with no control side needed (a detached run goes
on with the laptop gone):

- **Gang admission.** A member says ``admitted`` when its node's queue gave it
  slots. When every node is admitted, the coordinator asks all to commit them
  (``prepare``); each answers ``ready`` (committed: no older run can take them any
  more) or ``unadmitted`` (an older run took them meanwhile: then every node is told
  to ``cancel``, uncommits, and admission starts over). When all are ready, it picks
  the rendezvous port on node 0 (``pick_port``: free, and reserved in node 0's queue
  state so no other run takes it) and sends ``go``: only then does any node start
  torchrun. So a run starts on all its nodes or on none, and no node waits at the
  rendezvous for a node that is still queued.
- **Fail fast.** The first ``failed`` report, or a member whose connection drops or
  that is silent for :data:`~higgsfield.node.gang.wire.LOST_S` seconds (a node that
  died, froze or lost its network), or a node that never joined within ``join_s``,
  makes it broadcast ``abort`` at once: every node stops its torchrun. A ``killed``
  member (``higgsfield kill`` reached that node) aborts the others as killed.
- **Stalls.** Once it said ``go`` it watches every node's ``progress``
  (:class:`~higgsfield.node.gang.stall.StallWatch`): a run none of whose ranks
  progresses within its ``stall_timeout`` is stalled; every node's ranks' stacks are
  diagnosed, and the run fails (through the fail-fast path below), restarts its
  workers or waits, as its ``on_stall`` says.
- **The verdict.** Reports that follow within :data:`SETTLE_S` (ranks that failed
  *because* a peer died) are weighed: the failure that happened first (its ``at``,
  the failing rank's own time) is the run's, broadcast as ``verdict`` so every node
  records the same first failing node, rank and error.
- **Recovery.** A first failure that is a lost node the run may go on without
  (:mod:`higgsfield.node.gang.recovery`) gets the survivors ``regroup`` instead of a verdict, once
  each has stopped; admission starts over on them. A lost node never rejoins the run.

It ends when every member has given its final word (or was lost) and the verdict is
out, saying ``bye``.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from higgsfield.contract.failure import Failure, Verdict
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
    LastWord,
    Message,
    Prepare,
    Progress,
    Ready,
    Regroup,
    Stacks,
    Stopped,
    Unadmitted,
    Welcome,
)
from higgsfield.contract.stall_policy import StallPolicy
from higgsfield.node.gang import wire
from higgsfield.node.gang.recovery import Decision, losses_line, next_step
from higgsfield.node.gang.stall import StallWatch

SETTLE_S = 1.0      # after the first failure, how long later reports may still name an earlier one
JOIN_S = 120.0      # every node's supervisor must have joined by then
SEND_TIMEOUT_S = 2.0


@dataclass
class _Conn:
    sock: socket.socket
    reader: wire.LineReader = field(default_factory=lambda: wire.LineReader(wire.MAX_HELLO))
    nonce: str = field(default_factory=wire.nonce)
    opened: float = field(default_factory=time.monotonic)
    rank: int | None = None            # set once authenticated
    last_seen: float = field(default_factory=time.monotonic)
    last_seen_wall: float = field(default_factory=time.time)


def lost_failure(node: str, why: str, at: float) -> Failure:
    """The failure of a node that vanished: no rank, the time it was last heard of."""
    return Failure(node=node, rank=None, at=at, reason=f"node {node} was lost: {why}", lost=True)


class Coordinator:
    """Serve one run's members until each has ended; see the module doc."""

    def __init__(self, listener: socket.socket, *, token: str, run: str, nodes: list[str],
                 pick_port: Callable[[], int], join_s: float = JOIN_S,
                 say: Callable[[str], None] = lambda _m: None, stall: StallPolicy | None = None,
                 max_restarts: int = 0, min_nodes: int = 0, max_recoveries: int = 0) -> None:
        self.listener = listener
        self.token, self.run, self.nodes = token, run, nodes
        self.active = list(range(len(nodes)))   # the member ranks of the run's nodes now (fewer after a loss)
        self.min_nodes, self.max_recoveries = min_nodes, max_recoveries
        self.lost_nodes: list[str] = []          # every node lost and recovered from, in order
        self.recoveries: list[tuple[float, list[str]]] = []   # (when, the nodes lost) per recovery
        self.pick_port, self.join_s, self.say = pick_port, join_s, say
        self.members: dict[int, _Conn] = {}
        self.pending: list[_Conn] = []
        self.joined: set[int] = set()
        self.admitted: set[int] = set()
        self.ready: set[int] = set()
        self.preparing = False
        self.port: int | None = None
        self.final: dict[int, LastWord] = {}
        self.candidates: list[Failure] = []
        self.abort_kind: str | None = None
        self.abort_at = 0.0
        self.verdict: Verdict | None = None
        self.verdict_sent = False
        self._stall_args = (stall or StallPolicy(0, 0), max_restarts)
        self.stall = self.new_stall()
        self.done = threading.Event()
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._last_hb = 0.0
        self._sel = selectors.DefaultSelector()
        self._thread = threading.Thread(target=self._loop, name="higgsfield-coordinator", daemon=True)

    def new_stall(self) -> StallWatch:
        return StallWatch(self._stall_args[0], self.nodes, broadcast=self.broadcast, fail=self._fail, say=self.say,
                          max_restarts=self._stall_args[1])

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
        conn = _Conn(sock)
        if len(self.pending) >= 4 * len(self.nodes) + 8:  # a flood of strangers: keep the oldest waiting
            sock.close()
            return
        self.pending.append(conn)
        self._sel.register(sock, selectors.EVENT_READ, conn)
        self._send(conn, Challenge(conn.nonce))

    def _readable(self, conn: _Conn) -> None:
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

    def _hello(self, conn: _Conn, msg: wire.Received) -> bool:
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
        if self.abort_kind is not None:  # it joins a run that is already over
            self._send(conn, Abort.of(self._verdict_so_far()))
        return True

    def _drop(self, conn: _Conn, why: str) -> None:
        if conn in self.pending:
            self.pending.remove(conn)
        self._close(conn)
        rank = conn.rank
        if rank is None or self.members.get(rank) is not conn:
            return
        del self.members[rank]
        if rank not in self.final:
            self.final[rank] = LastWord.LOST
            self._fail(lost_failure(self.nodes[rank], why, conn.last_seen_wall))

    def _close(self, conn: _Conn) -> None:
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        try:
            conn.sock.close()
        except OSError:
            pass

    def _send(self, conn: _Conn, msg: Message) -> None:
        try:
            conn.sock.sendall(wire.encode(msg))
        except OSError as e:
            self._drop(conn, f"connection lost ({e})")

    def broadcast(self, msg: Message) -> None:
        for conn in list(self.members.values()):
            self._send(conn, msg)

    # -- the run -----------------------------------------------------------------------------------

    def _handle(self, rank: int, msg: Message) -> None:
        node = self.nodes[rank]
        match msg:
            case Heartbeat():
                pass
            case Admitted():
                self.admitted.add(rank)
            case Unadmitted():
                self.admitted.discard(rank)
                if self.preparing:
                    self.preparing = False
                    self.ready.clear()
                    self.broadcast(Cancel())
            case Ready():
                if self.preparing:
                    self.ready.add(rank)
                    if len(self.ready) == len(self.active):
                        self._go()
            case Progress(work=work):
                self.stall.progress(rank, time.time(), work)
            case Stacks(ranks=ranks):
                self.stall.stacks(rank, ranks)
            case Finished():
                self.final[rank] = LastWord.FINISHED
            case Stopped():
                self.final[rank] = LastWord.STOPPED
            case Failed(failure=failure):
                self.final[rank] = LastWord.FAILED
                self._fail(replace(failure, node=node) if failure is not None   # the node is the sender's
                           else Failure(node, None, time.time(), f"node {node} failed (its report held no failure)"))
            case Killed():
                self.final[rank] = LastWord.KILLED
                if self.abort_kind is None:
                    self.abort_kind, self.abort_at = "killed", time.monotonic()
                    self.verdict = Verdict("killed", node=node)
                    self.broadcast(Abort.of(self.verdict))
            case _:
                self.say(f"node {node} sent a {msg.TAG!r}, which is no member's message: dropped")
        if not self.preparing and self.port is None and self.abort_kind is None \
                and len(self.admitted) == len(self.active):
            self.preparing = True
            self.ready.clear()
            self.broadcast(Prepare())

    def _undecoded(self, rank: int, bad: wire.Undecoded) -> None:
        """A line that did not decode: logged and dropped; a ``failed`` report still fails its node, naming it."""
        node = self.nodes[rank]
        if bad.claims is Failed:
            self.final[rank] = LastWord.FAILED
            self._fail(Failure(node, None, time.time(), f"node {node} failed (its report did not decode: {bad.why})"))
        else:
            self.say(f"node {node} sent a message that did not decode, dropped: {bad.why}")

    def _go(self) -> None:
        self.preparing = False
        try:
            self.port = self.pick_port()
        except Exception as e:  # noqa: BLE001 - no port: the run cannot start anywhere
            self._fail(Failure(self.nodes[0], None, time.time(), f"no free rendezvous port on {self.nodes[0]}: {e}"))
            return
        self.say(f"every node admitted: go (rendezvous port {self.port})")
        self.stall.start(time.time())
        self.broadcast(Go(self.port))

    # -- stalls (see :mod:`higgsfield.node.gang.stall`) -------------------------------------------------

    def _stall_tick(self) -> None:
        if self.abort_kind is None and LastWord.FINISHED not in self.final.values():   # a finishing run is not hung
            self.stall.tick([r for r in self.members if r not in self.final])

    def _fail(self, failure: Failure) -> None:
        self.candidates.append(failure)
        if self.abort_kind is None:
            self.abort_kind, self.abort_at = "failed", time.monotonic()
            self.say(f"abort: {failure.reason}")
            self.broadcast(Abort.of(self._verdict_so_far()))

    def _verdict_so_far(self) -> Verdict:
        if self.abort_kind == "failed":
            return Verdict("failed", self.first_failure())
        return self.verdict or Verdict("killed")

    def _regroup(self, d: Decision) -> None:
        names = [self.nodes[r] for r in d.lost]
        self.recoveries.append((time.time(), names))
        self.lost_nodes += names
        self.active = list(d.survivors)
        self.final, self.admitted, self.ready, self.candidates = {}, set(), set(), []
        self.preparing, self.port, self.abort_kind, self.verdict, self.verdict_sent = False, None, None, None, False
        self.stall = self.new_stall()
        nodes = tuple(self.nodes[r] for r in self.active)
        self.say(f"recovery {len(self.recoveries)}: {', '.join(names)} lost; the run goes on on {', '.join(nodes)}")
        self.broadcast(Regroup(nodes=nodes, lost=tuple(self.lost_nodes), recovery=len(self.recoveries)))

    def first_failure(self) -> Failure:
        """The failure that happened first (by the failing side's own clock), lost nodes on ties."""
        return min(self.candidates, key=Failure.sort_key)

    def _tick(self) -> None:
        self._stall_tick()
        now = time.monotonic()
        if now - self._last_hb >= wire.HEARTBEAT_S:
            self._last_hb = now
            self.broadcast(Heartbeat())
        for conn in list(self.members.values()):
            if conn.rank not in self.final and now - conn.last_seen > wire.LOST_S:
                self._drop(conn, f"no heartbeat for {now - conn.last_seen:.0f}s")
        for conn in [c for c in self.pending if now - c.opened > wire.HANDSHAKE_S]:
            self.pending.remove(conn)
            self._close(conn)
        if now - self._started > self.join_s:
            for rank in range(len(self.nodes)):
                if rank not in self.joined and rank not in self.final:
                    self.final[rank] = LastWord.LOST
                    self._fail(lost_failure(self.nodes[rank], f"its supervisor never joined ({self.join_s:.0f}s)",
                                            time.time()))
        every = all(r in self.final for r in self.active)
        settled = self.abort_kind is not None and (now - self.abort_at >= SETTLE_S or every)
        if settled and not self.verdict_sent:
            step = next_step(self.active, self.final, self.first_failure(), waited=now - self.abort_at,
                             min_nodes=self.min_nodes, recoveries=len(self.recoveries),
                             max_recoveries=self.max_recoveries) if self.abort_kind == "failed" else None
            if step is not None:   # regroup now, or wait for the survivors to stop
                return self._regroup(step) if isinstance(step, Decision) else None
            self.verdict_sent = True
            if self.abort_kind == "failed":
                self.verdict = Verdict("failed", losses_line(self.lost_nodes, self.first_failure()))
            self.broadcast(FinalVerdict.of(self.verdict or Verdict("killed")))
        if every and (self.abort_kind is None or self.verdict_sent):
            self.broadcast(Bye())
            self.done.set()

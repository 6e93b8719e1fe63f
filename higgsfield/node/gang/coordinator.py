"""A run's coordinator: a small TCP service on node 0 that gangs its nodes together.

Node 0's supervisor hosts it, in a thread (the wire's serving is
:class:`~higgsfield.node.gang.server.GangServer`'s), on a port its ``invoker start`` bound
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

import socket
import time
from collections.abc import Callable
from dataclasses import replace

from higgsfield.contract.failure import Failure, Verdict
from higgsfield.contract.gang import (
    Abort,
    Admitted,
    Bye,
    Cancel,
    Failed,
    FinalVerdict,
    Finished,
    Go,
    Heartbeat,
    Killed,
    LastWord,
    Message,
    Prepare,
    Progress,
    Ready,
    Regroup,
    Stacks,
    Standby,
    Standbys,
    Stopped,
    Straggling,
    Unadmitted,
)
from higgsfield.contract.stall_policy import StallPolicy
from higgsfield.node.gang import wire
from higgsfield.node.gang.recovery import Decision, losses_line, next_step, replacement
from higgsfield.node.gang.server import Conn, GangServer
from higgsfield.node.gang.stall import StallWatch

#: After the first failure, how long later reports may still name an earlier one: past a member's stop
#: after an abort (:data:`wire.ABORT_GRACE_S`, then SIGKILL), since a node whose failing rank lingers
#: reports only once it stopped (a 1 s window missed it on a loaded machine, and a peer's "connection
#: closed" was named the run's cause). No one waits for it when every member has given its final word.
SETTLE_S = wire.ABORT_GRACE_S + 2.0
JOIN_S = 120.0      # every node's supervisor must have joined by then


def lost_failure(node: str, why: str, at: float) -> Failure:
    """The failure of a node that vanished: no rank, the time it was last heard of."""
    return Failure(node=node, rank=None, at=at, reason=f"node {node} was lost: {why}", lost=True)


class Coordinator(GangServer):
    """Serve one run's members until each has ended; see the module doc."""

    def __init__(self, listener: socket.socket, *, token: str, run: str, nodes: list[str],
                 pick_port: Callable[[], int], join_s: float = JOIN_S,
                 say: Callable[[str], None] = lambda _m: None, stall: StallPolicy | None = None,
                 max_restarts: int = 0, min_nodes: int = 0, max_recoveries: int = 0, spares: int = 0,
                 lost_before: tuple[str, ...] = (), recovered: int = 0, on_straggler: str = "warn") -> None:
        super().__init__(listener, token=token, run=run, nodes=nodes, say=say)   # every member's name, spares last
        self.active = list(range(len(nodes) - spares))   # the member ranks of the run's nodes now
        self.spares = list(range(len(nodes) - spares, len(nodes)))   # standing by (admitted, holding slots)
        self.admission = list(range(len(nodes)))   # the members admission waits for (after a regroup: the nodes)
        self.min_nodes, self.max_recoveries = min_nodes, max_recoveries
        self.lost_nodes: list[str] = list(lost_before)   # every node lost and recovered from, in order
        self.recoveries: list[tuple[float, list[str]]] = []   # (when, the nodes lost) per recovery it made
        self.recovered_before = recovered        # recoveries made by an earlier coordinator (node 0 lost since)
        self.standbys: dict[str, int] = {}       # where each member would host the coordinator (node 0 lost)
        self.replace_stragglers = on_straggler == "replace"
        self.replaced: set[int] = set()          # members put out as stragglers: nothing they say counts now
        self.pick_port, self.join_s = pick_port, join_s
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
        self._last_hb = 0.0

    def new_stall(self) -> StallWatch:
        return StallWatch(self._stall_args[0], self.nodes, broadcast=self._watched, fail=self._fail, say=self.say,
                          max_restarts=self._stall_args[1])

    # -- the run -----------------------------------------------------------------------------------

    def _handle(self, rank: int, msg: Message) -> None:
        if rank in self.replaced:
            return
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
                    if len(self.ready) == len(self.admission):
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
            case Standby(port=port):
                self.standbys[node] = port
                self.broadcast(Standbys(dict(self.standbys)))
            case Killed():
                self.final[rank] = LastWord.KILLED
                if self.abort_kind is None:
                    self.abort_kind, self.abort_at = "killed", time.monotonic()
                    self.verdict = Verdict("killed", node=node)
                    self.broadcast(Abort.of(self.verdict))
            case _:
                self.say(f"node {node} sent a {msg.TAG!r}, which is no member's message: dropped")
        if not self.preparing and self.port is None and self.abort_kind is None \
                and len(self.admitted) == len(self.admission):
            self.preparing = True
            self.ready.clear()
            self.broadcast(Prepare())

    def _joined(self, conn: Conn) -> None:
        if self.standbys:
            self._send(conn, Standbys(dict(self.standbys)))
        if self.abort_kind is not None:  # it joins a run that is already over
            self._send(conn, Abort.of(self._verdict_so_far()))

    def _lost(self, rank: int, why: str, last_seen_wall: float) -> None:
        if rank in self.replaced:
            return
        if rank in self.spares:   # a spare lost: one fewer to take a place, the run goes on
            self._spare_gone(rank, why)
        elif rank not in self.final:
            self.final[rank] = LastWord.LOST
            self._fail(lost_failure(self.nodes[rank], why, last_seen_wall))

    def _undecoded(self, rank: int, bad: wire.Undecoded) -> None:
        """A line that did not decode: logged and dropped; a ``failed`` report still fails its node, naming it."""
        node = self.nodes[rank]
        if rank in self.replaced:
            return
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
        self.spares = [r for r in self.spares if r not in d.survivors]
        self.active = self.admission = list(d.survivors)
        self.final, self.admitted, self.ready, self.candidates = {}, set(), set(), []
        self.preparing, self.port, self.abort_kind, self.verdict, self.verdict_sent = False, None, None, None, False
        self.stall = self.new_stall()
        nodes = tuple(self.nodes[r] for r in self.active)
        self.say(f"recovery {self.recovered}: {', '.join(names)} lost; the run goes on on {', '.join(nodes)}")
        self.broadcast(Regroup(nodes=nodes, lost=tuple(self.lost_nodes), recovery=self.recovered,
                               replaced=tuple(n for r, n in zip(d.lost, names, strict=True) if r in self.replaced)))

    def _watched(self, msg: Message) -> None:
        """What the stall watch sends out; with ``on_straggler: replace`` a straggler's node is put out of the run
        for a standing-by spare, as a lost node is (:func:`~higgsfield.node.gang.recovery.replacement`)."""
        self.broadcast(msg)
        if not (isinstance(msg, Straggling) and msg.stragglers and self.replace_stragglers and self.abort_kind is None):
            return
        found = replacement(msg.stragglers, self.nodes, self.active, [r for r in self.spares if r in self.members],
                            recoveries=self.recovered, max_recoveries=self.max_recoveries)
        if isinstance(found, str):
            self.say(f"on_straggler replace: {found}")
            return
        rank, s = found
        self.replaced.add(rank)
        self.final[rank] = LastWord.LOST
        self._fail(Failure(s.node, s.rank, time.time(), f"node {s.node} put out of the run for a spare: rank "
                                                        f"{s.rank} is a straggler ({s.summary})", lost=True))

    def _spare_gone(self, rank: int, why: str) -> None:
        self.spares.remove(rank)
        self.say(f"spare {self.nodes[rank]} is gone ({why}): it takes no lost node's place")
        if rank in self.admission:
            self.admission.remove(rank)
            self.admitted.discard(rank)
            self.ready.discard(rank)

    def fail_lost(self, failure: Failure) -> None:
        """A node lost before this coordinator served (node 0, when this one took it over): the run's failure."""
        self._fail(failure)

    def _spares_coming(self, now: float) -> bool:
        return self.first_failure().lost and now - self._started <= self.join_s \
            and any(r not in self.joined for r in self.spares)

    @property
    def recovered(self) -> int:
        """How many recoveries the run has made, this coordinator's and any before it."""
        return self.recovered_before + len(self.recoveries)

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
                if rank in self.spares and rank not in self.joined:
                    self._spare_gone(rank, "its supervisor never joined")
                elif rank not in self.joined and rank not in self.final:
                    self.final[rank] = LastWord.LOST
                    self._fail(lost_failure(self.nodes[rank], f"its supervisor never joined ({self.join_s:.0f}s)",
                                            time.time()))
        every = all(r in self.final for r in self.active)
        settled = self.abort_kind is not None and (now - self.abort_at >= SETTLE_S or every)
        if settled and not self.verdict_sent:
            if self.abort_kind == "failed" and self._spares_coming(now):
                return   # a node lost: a spare that has not joined yet (a coordinator taken over) may take its place
            step = next_step(self.active, self.final, self.first_failure(), waited=now - self.abort_at,
                             min_nodes=self.min_nodes, recoveries=self.recovered,
                             max_recoveries=self.max_recoveries,
                             spares=tuple(r for r in self.spares if r in self.members)) \
                if self.abort_kind == "failed" else None
            if step is not None:   # regroup now, or wait for the survivors to stop
                return self._regroup(step) if isinstance(step, Decision) else None
            self.verdict_sent = True
            if self.abort_kind == "failed":
                self.verdict = Verdict("failed", losses_line(self.lost_nodes, self.first_failure()))
            self.broadcast(FinalVerdict.of(self.verdict or Verdict("killed")))
        if every and (self.abort_kind is None or self.verdict_sent):
            self.broadcast(Bye())
            self.done.set()

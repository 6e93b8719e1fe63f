"""A run's stall, as its coordinator handles it: watch the nodes' progress, collect the stacks, act.

The coordinator (:mod:`higgsfield.node.gang.coordinator`) owns one :class:`StallWatch`
and feeds it: ``start`` on ``go``, every member's ``progress`` (stamped with the time
it arrives there, so the nodes' clocks need not agree) and ``stacks``, and a ``tick``
about five times a second. The watch runs the run's
:class:`~higgsfield.node.gang.watchdog.Watchdog` and, when no node progressed within
``stall_timeout`` (``startup_timeout`` before the first progress):

1. broadcasts ``stall``; each member takes its ranks' stacks and answers ``stacks``;
2. once every live member answered, or after :data:`STACKS_WAIT_S`, it diagnoses them
   (:func:`higgsfield.contract.stacks.diagnose`, a node that sent none named as odd) and
   broadcasts ``stalled`` with the diagnosis (every node keeps it in its record);
3. then, per ``on_stall``: ``fail`` fails the run (:func:`stall_failure`: the first odd
   rank is the failure's node and rank, its reason ``stalled: <summary>``); ``restart``
   broadcasts ``restart`` (each node kills its workers, torchrun restarts them from the
   last checkpoint) while restarts are left (``max_restarts``), else fails; ``wait``
   waits, and broadcasts ``progressing`` when a node progresses again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from higgsfield.contract.failure import Failure
from higgsfield.contract.gang import Message, Progressing, Restart, Stall, Stalled, StallPhase, Straggling
from higgsfield.contract.stacks import Diagnosis, RankStacks, diagnose
from higgsfield.contract.stall_policy import OnStall, StallPolicy
from higgsfield.contract.straggler import RankWork
from higgsfield.node.gang.stragglers import StragglerRule
from higgsfield.node.gang.watchdog import Watchdog

STACKS_WAIT_S = 8.0  # after ``stall``: how long the members have to send their ranks' stacks


def stall_failure(d: Diagnosis, nodes: list[str], at: float) -> Failure:
    """The failure of a run that stalled: named by its first odd rank (else the first rank of the largest
    group), the reason ``stalled: <summary>``, the tail that rank's stack."""
    who = d.first_odd
    group = next((g for g in d.groups if d.odd and d.odd[0] in g.ranks), d.groups[0] if d.groups else None)
    if who is None and group is not None and group.ranks:
        first, _, number = group.ranks[0].rpartition("/")
        who = (first, int(number)) if number.isdigit() and first else None
    node: str = who[0] if who is not None else nodes[0]
    rank: int | None = who[1] if who is not None else None
    tail = [f"{f.file}:{f.line} in {f.function}" + (f": {f.code}" if f.code else "")
            for f in (group.frames if group is not None else ())]
    return Failure(node=node, rank=rank, at=at, reason=f"stalled: {d.summary}", tail=tail[-50:])


class StallWatch:
    """One run's stall handling on its coordinator (see the module doc); single-threaded, like its owner."""

    def __init__(self, policy: StallPolicy, nodes: list[str], *, broadcast: Callable[[Message], None],
                 fail: Callable[[Failure], None], say: Callable[[str], None] = lambda _m: None,
                 max_restarts: int = 0) -> None:
        self.policy, self.nodes, self.max_restarts = policy, nodes, max_restarts
        self.broadcast, self.fail, self.say = broadcast, fail, say
        self.dog: Watchdog | None = None                 # set by start (the run's go)
        self.phase = StallPhase.WATCH
        self.asked_at = 0.0
        self.collected: dict[int, list[RankStacks]] = {}
        self.restarts = 0
        self.diagnosis: Diagnosis | None = None
        self.stragglers = StragglerRule()                # the slow rank, named by its own work per step


    def start(self, now: float) -> None:
        if not self.policy.off:
            self.dog = Watchdog(self.policy.stall_timeout, self.policy.startup_timeout, now)

    def progress(self, node_rank: int, now: float, work: Sequence[RankWork] = ()) -> None:
        """Node ``node_rank``'s ranks progressed (the message arrived at ``now``), with their own work per step
        (judged by :mod:`~higgsfield.node.gang.stragglers`; a change of the ranks named is broadcast)."""
        node = self.nodes[node_rank]
        if work and self.stragglers.report([replace(w, node=node) for w in work], now):
            found = self.stragglers.findings()
            self.say("stragglers: " + ("; ".join(s.summary for s in found) if found else "none now"))
            self.broadcast(Straggling(found, now))
        if self.dog is None:
            return
        self.dog.progress(self.nodes[node_rank], now)
        if self.phase is StallPhase.WAITING:
            self.phase = StallPhase.WATCH
            self.say(f"progress again (node {self.nodes[node_rank]})")
            self.broadcast(Progressing())

    def stacks(self, node_rank: int, ranks: Sequence[RankStacks]) -> None:
        """Node ``node_rank``'s answer to ``stall``; each rank named by the sender's node, whatever it says."""
        if self.phase is not StallPhase.COLLECT:
            return
        self.collected[node_rank] = [replace(s, node=self.nodes[node_rank]) for s in ranks]

    def tick(self, alive: list[int]) -> None:
        """Find a stall, wait for the stacks of the ``alive`` members, then act (see the module doc)."""
        if self.dog is None:
            return
        now = time.time()
        if self.phase is StallPhase.WATCH and self.dog.stalled(now):
            self.phase, self.asked_at, self.collected = StallPhase.COLLECT, time.monotonic(), {}
            self.say(f"stalled: no progress for {self.dog.since(now):.0f}s; taking every rank's stacks")
            self.broadcast(Stall())
        elif self.phase is StallPhase.COLLECT:
            if not all(r in self.collected for r in alive) and time.monotonic() - self.asked_at < STACKS_WAIT_S:
                return
            self._act(now)

    def _act(self, now: float) -> None:
        assert self.dog is not None
        silent = [n for i, n in enumerate(self.nodes) if i not in self.collected]
        d = self.diagnosis = diagnose([s for r in sorted(self.collected) for s in self.collected[r]], silent)
        self.say(f"stalled: {d.summary}")
        self.broadcast(Stalled(d, now))
        if self.policy.on_stall == OnStall.WAIT:
            self.phase = StallPhase.WAITING
        elif self.policy.on_stall == OnStall.RESTART and self.restarts < self.max_restarts:
            self.restarts += 1
            self.say(f"restarting the workers ({self.restarts} of {self.max_restarts})")
            self.dog.restart(now)
            self.phase = StallPhase.WATCH
            self.broadcast(Restart())
        else:
            self.phase = StallPhase.FAILED
            self.fail(stall_failure(d, self.nodes, now))

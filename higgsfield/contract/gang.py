"""The gang wire's messages: one frozen dataclass per kind, the contract both ends of a run's wire read.

A run's nodes talk over :mod:`higgsfield.node.gang.wire` (one JSON object a line over TCP,
after a mutual HMAC handshake): every node's supervisor is a *member*, node 0's also
hosts the run's *coordinator*. A line's ``"t"`` names its kind (the class's ``TAG``),
its other keys are the class's fields: ``encode(Go(29500))`` is ``{"t": "go", "port": 29500}``,
the bytes of the dict-based wire this replaced, so nodes of either release talk. The
receiver decodes each line once, ``decode_tagged(KINDS, obj)``, and dispatches on the
type. A line that does not decode (an unknown kind from a newer node, a field of the
wrong type) is a one-line :class:`~higgsfield.contract.decode.DecodeError`: the receiver
logs it, naming the node that sent it, and drops it.

The handshake (nothing else is read before it)::

    coordinator -> Challenge(nonce)
    member      -> Hello(rank, node, nonce, mac)      mac: HMAC(token, "member", run, rank, both nonces)
    coordinator -> Welcome(mac)                        mac: HMAC(token, "coordinator", ...)

Member -> coordinator: :class:`Heartbeat`; :class:`Admitted` (this node holds its
slots); :class:`Unadmitted` (an older run took them); :class:`Ready` (committed after
``prepare``); :class:`Progress` (its ranks progressed); :class:`Stacks` (the answer to
``stall``); its last word: :class:`Finished`, :class:`Failed`, :class:`Killed` or
:class:`Stopped` (it stopped after an abort); :class:`Standby` (where it would host the coordinator).

Coordinator -> member: :class:`Heartbeat`; :class:`Prepare`; :class:`Cancel`;
:class:`Go` (the rendezvous port); :class:`Abort` and :class:`FinalVerdict` (a
:class:`~higgsfield.contract.failure.Verdict`'s fields); :class:`Bye`; :class:`Stall`
(take your ranks' stacks); :class:`Stalled` (the diagnosis); :class:`Progressing` (a
waited-out stall ended); :class:`Restart` (kill your workers: torchrun restarts them);
:class:`Straggling` (the ranks named stragglers now);
:class:`Regroup` (a node was lost: the run goes on on these nodes, from its last checkpoint);
:class:`Standbys` (where each member would host the coordinator, should node 0 be lost).

The states either end keeps are :class:`Admission` (a member's), :class:`LastWord` and
:class:`StallPhase` (the coordinator's).

Use::

    line = json.dumps(encode(Go(port=29500)))
    match decode_tagged(KINDS, json.loads(line)):
        case Go(port=port): ...
"""

from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass, field
from typing import ClassVar, TypeAlias, TypeVar

from higgsfield.contract.codec import decode, rule
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.failure import Failure, Verdict
from higgsfield.contract.stacks import Diagnosis, RankStacks
from higgsfield.contract.straggler import RankWork, Straggler

MAX_RANKS = 4096    # rank stacks one node may send (the rest are left out)


class _Named(str, enum.Enum):
    """A state as its value: ``str(x)`` and f-strings give ``"ready"`` (Python 3.10 has no StrEnum)."""

    def __str__(self) -> str:
        return str(self.value)

    def __hash__(self) -> int:   # equal to its string, so hashed like it ("ready" in {Admission.READY})
        return hash(self.value)


class Admission(_Named):
    """Where a member is in gang admission."""

    WAITING = "waiting"      # in its node's queue, without slots
    ADMITTED = "admitted"    # holds its slots (said Admitted)
    READY = "ready"          # committed them after Prepare (said Ready): waits for Go


class LastWord(_Named):
    """A member's last word, as the coordinator keeps it (``lost``: it vanished without one)."""

    FINISHED = "finished"
    STOPPED = "stopped"
    FAILED = "failed"
    KILLED = "killed"
    LOST = "lost"


class StallPhase(_Named):
    """The coordinator's stall watch (:mod:`higgsfield.node.gang.stall`)."""

    WATCH = "watch"          # watching the nodes' progress
    COLLECT = "collect"      # stalled: Stall sent, collecting the nodes' stacks
    WAITING = "waiting"      # on_stall=wait: stalled, until a node progresses again
    FAILED = "failed"        # the stall failed the run


# -- field decoders -------------------------------------------------------------------------------------

def _reported_failure(v: object) -> Failure:
    """A member's failure; its ``node`` is not read: the coordinator names the node the report came from."""
    return decode(Failure, {**v, "node": None} if isinstance(v, dict) else v)


def _rank_stacks(v: object) -> tuple[RankStacks, ...]:
    """A node's ranks' stacks; a rank's that do not decode are left out (the others still diagnose)."""
    if not isinstance(v, list):
        raise ValueError("a list")
    out = []
    for item in v[:MAX_RANKS]:
        with contextlib.suppress(DecodeError):
            out.append(decode(RankStacks, item))
    return tuple(out)


def _rank_work(v: object) -> tuple[RankWork, ...]:
    """A node's ranks' own work; a rank's that does not decode is left out (the others are still judged)."""
    if not isinstance(v, list):
        raise ValueError("a list")
    out = []
    for item in v[:MAX_RANKS]:
        with contextlib.suppress(DecodeError):
            out.append(decode(RankWork, item))
    return tuple(out)


def _port(v: int) -> None:
    if not 0 < v < 65536:
        raise ValueError("must be a TCP port")


# -- the handshake ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Challenge:
    """The coordinator's first line on a new connection: prove the run's token over this nonce."""

    TAG: ClassVar[str] = "challenge"
    nonce: str


@dataclass(frozen=True)
class Hello:
    """A member's answer to the challenge: its node rank and name, its own nonce, the proof."""

    TAG: ClassVar[str] = "hello"
    rank: int
    node: str
    nonce: str
    mac: str


@dataclass(frozen=True)
class Welcome:
    """The coordinator's proof that it holds the run's token too: the member is in."""

    TAG: ClassVar[str] = "welcome"
    mac: str


@dataclass(frozen=True)
class Heartbeat:
    """Both ends send one at least every second; silence for longer than ``wire.LOST_S`` is a lost peer."""

    TAG: ClassVar[str] = "hb"


# -- member -> coordinator ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Admitted:
    """This node's queue gave the run its slots."""

    TAG: ClassVar[str] = "admitted"


@dataclass(frozen=True)
class Unadmitted:
    """An older run took this node's slots back (or it could not commit them)."""

    TAG: ClassVar[str] = "unadmitted"


@dataclass(frozen=True)
class Ready:
    """The slots are committed after Prepare: no older run can take them any more."""

    TAG: ClassVar[str] = "ready"


@dataclass(frozen=True)
class Progress:
    """This node's ranks progressed: ``at`` (the node's clock; the coordinator stamps its own), ``steps``: a step
    (else only output)."""

    TAG: ClassVar[str] = "progress"
    at: float
    steps: bool
    work: tuple[RankWork, ...] = field(default=(), metadata=rule(decode=_rank_work, sparse=True))
    """Its ranks' latest own work per step (:mod:`higgsfield.contract.straggler`); an older node sends none."""


@dataclass(frozen=True)
class Stacks:
    """The answer to Stall: this node's ranks' stacks (each named by the node it came from, whatever it says)."""

    TAG: ClassVar[str] = "stacks"
    ranks: tuple[RankStacks, ...] = field(default=(), metadata=rule(decode=_rank_stacks))


@dataclass(frozen=True)
class Finished:
    """Last word: torchrun exited 0."""

    TAG: ClassVar[str] = "finished"


@dataclass(frozen=True)
class Failed:
    """Last word: this node's part failed (``failure.node`` is not read: the coordinator names the sender)."""

    TAG: ClassVar[str] = "failed"
    failure: Failure | None = field(default=None, metadata=rule(decode=_reported_failure))


@dataclass(frozen=True)
class Killed:
    """Last word: ``higgsfield kill`` reached this node."""

    TAG: ClassVar[str] = "killed"


@dataclass(frozen=True)
class Stopped:
    """Last word: this node stopped its part after an Abort."""

    TAG: ClassVar[str] = "stopped"


# -- coordinator -> member ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Prepare:
    """Every node is admitted: commit your slots (answer Ready or Unadmitted)."""

    TAG: ClassVar[str] = "prepare"


@dataclass(frozen=True)
class Cancel:
    """A node lost its slots while preparing: uncommit yours, admission starts over."""

    TAG: ClassVar[str] = "cancel"


@dataclass(frozen=True)
class Go:
    """Every node is ready: start torchrun, its rendezvous on node 0's ``port``."""

    TAG: ClassVar[str] = "go"
    port: int = field(metadata=rule(check=_port))


V = TypeVar("V", bound="_VerdictMessage")


@dataclass(frozen=True)
class _VerdictMessage(Verdict):
    """A :class:`~higgsfield.contract.failure.Verdict` on the wire: its fields (``failure`` and ``node`` only
    when set) beside the tag."""

    @property
    def verdict(self) -> Verdict:
        return Verdict(self.kind, self.failure, self.node)

    @classmethod
    def of(cls: type[V], verdict: Verdict) -> V:
        return cls(verdict.kind, verdict.failure, verdict.node)


@dataclass(frozen=True)
class Abort(_VerdictMessage):
    """Stop your part now: another node failed, was killed or was lost (the verdict so far)."""

    TAG: ClassVar[str] = "abort"


@dataclass(frozen=True)
class FinalVerdict(_VerdictMessage):
    """The run's verdict, settled (the failure that happened first): every node records the same."""

    TAG: ClassVar[str] = "verdict"


@dataclass(frozen=True)
class Bye:
    """Every member gave its last word and the verdict is out: the coordinator ends."""

    TAG: ClassVar[str] = "bye"


@dataclass(frozen=True)
class Stall:
    """No rank progressed within the stall timeout: take your ranks' stacks and answer Stacks."""

    TAG: ClassVar[str] = "stall"


@dataclass(frozen=True)
class Stalled:
    """The stall's diagnosis (``at``: the coordinator's clock): every node keeps it in its record."""

    TAG: ClassVar[str] = "stalled"
    diagnosis: Diagnosis
    at: float


@dataclass(frozen=True)
class Straggling:
    """The ranks named stragglers now (none: the last one was cleared); every node keeps them in its record."""

    TAG: ClassVar[str] = "straggling"
    stragglers: tuple[Straggler, ...]
    at: float


@dataclass(frozen=True)
class Regroup:
    """A node was lost and the run goes on without it: its nodes from now on, in node-rank order (every one
    a survivor), the nodes lost so far, and this recovery's number. Sent to the survivors once each of them
    has stopped its torchrun; admission then starts over on them, and ``go`` starts the next attempt."""

    TAG: ClassVar[str] = "regroup"
    SPARSE: ClassVar[frozenset[str]] = frozenset({"replaced"})
    nodes: tuple[str, ...]
    lost: tuple[str, ...]
    recovery: int
    replaced: tuple[str, ...] = ()   # of ``lost``, the nodes put out as stragglers (``on_straggler: replace``)


@dataclass(frozen=True)
class Standby:
    """Where this member would host the run's coordinator should node 0 be lost (a port it holds bound)."""

    TAG: ClassVar[str] = "standby"
    port: int


@dataclass(frozen=True)
class Standbys:
    """Every member's :class:`Standby` port by node: the next node takes over a lost node 0's coordinator there
    (:mod:`higgsfield.node.gang.takeover`)."""

    TAG: ClassVar[str] = "standbys"
    ports: dict[str, int]


@dataclass(frozen=True)
class Progressing:
    """A waited-out stall ended: a node progressed again."""

    TAG: ClassVar[str] = "progressing"


@dataclass(frozen=True)
class Restart:
    """Kill your workers after the stall: torchrun restarts them (from the last checkpoint)."""

    TAG: ClassVar[str] = "restart"


Message: TypeAlias = (Challenge | Hello | Welcome | Heartbeat
                      | Admitted | Unadmitted | Ready | Progress | Stacks | Finished | Failed | Killed | Stopped
                      | Prepare | Cancel | Go | Abort | FinalVerdict | Bye | Stall | Stalled | Progressing | Restart
                      | Straggling | Regroup | Standby | Standbys)

#: Every kind on the wire, by its tag.
KINDS: dict[str, type[Message]] = {cls.TAG: cls for cls in (
    Challenge, Hello, Welcome, Heartbeat,
    Admitted, Unadmitted, Ready, Progress, Stacks, Finished, Failed, Killed, Stopped,
    Prepare, Cancel, Go, Abort, FinalVerdict, Bye, Stall, Stalled, Progressing, Restart, Straggling, Regroup,
    Standby, Standbys)}


def claimed_kind(data: object) -> type[Message] | None:
    """The kind a line that did not decode says it is (None: no kind this node knows)."""
    tag = data.get("t") if isinstance(data, dict) else None
    return KINDS.get(tag) if isinstance(tag, str) else None


__all__ = [
    "KINDS", "Abort", "Admission", "Admitted", "Bye", "Cancel", "Challenge", "Failed", "FinalVerdict", "Finished",
    "Go", "Heartbeat", "Hello", "Killed", "LastWord", "Message", "Prepare", "Progress", "Progressing", "Ready", "Regroup",
    "Restart", "Stall", "StallPhase", "Stalled", "Stacks", "Standby", "Standbys", "Stopped", "Straggling", "Unadmitted", "Welcome", "claimed_kind",
]

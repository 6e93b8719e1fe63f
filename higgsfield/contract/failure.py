"""A run's failure: the node and rank that failed, when by its own clock, why, and the last lines of its error.

It is made on the failing node (:func:`higgsfield.node.runs.failure.describe`, or by
the coordinator for a node that vanished), travels to the run's coordinator on node 0
and back to every node in the verdict (JSON over the coordinator's wire), and ends
in every node's record, which ``status`` shows. ``at`` is the failing side's own
time, so the coordinator names the failure that happened first rather than the ones
it caused on other nodes (ranks blocked in a collective fail when a peer dies).

Decoded once where it arrives (``codec.decode(Failure, data)``): a node of another
release, or a damaged message, gives a one-line :class:`DecodeError`, never a
``KeyError`` deep in the supervisor. A failure without a ``version`` is an earlier
release's, of this same shape.

Use::

    f = Failure(node="gpu-2", rank=5, at=time.time(), reason="rank 5: CUDA error", tail=["..."])
    decode(Failure, encode(f)) == f             # on the gang wire: contract.gang.Failed(f)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from higgsfield.contract.codec import decode, rule
from higgsfield.contract.decode import DecodeError, tail
from higgsfield.contract.text import has_control

FAILURE_VERSION = 1
MAX_REASON = 2000


@dataclass(frozen=True)
class Failure:
    """Which node and rank failed first (``rank`` None: the node's launcher itself, or a lost node)."""

    WHAT: ClassVar[str] = "failure"
    VERSION: ClassVar[int] = FAILURE_VERSION

    node: str | None
    rank: int | None
    at: float
    reason: str
    tail: list[str] = field(default_factory=list, metadata=rule(decode=tail))
    lost: bool = False
    """The node vanished (a dead machine, a dead supervisor): on a tie in ``at`` it is named first."""

    def check(self) -> None:
        if self.rank is not None and self.rank < 0:
            raise DecodeError(f"'rank' {self.rank} is not a rank")
        if len(self.reason) > MAX_REASON or (self.node is not None and (len(self.node) > 253
                                                                         or has_control(self.node))):
            raise DecodeError("'reason' or 'node' is too long or holds a control character")

    def sort_key(self) -> tuple[float, bool]:
        """Earliest first; on a tie, a lost node before a failing one."""
        return (self.at, not self.lost)


def _failure(v: object) -> Failure:
    return decode(Failure, v)     # its own version checked, as where a failure travels alone


@dataclass(frozen=True)
class Verdict:
    """How a run ended elsewhere, as the coordinator tells every node: ``failed`` (with the run's first
    failure) or ``killed`` (``node``: where ``higgsfield kill`` reached first)."""

    WHAT: ClassVar[str] = "verdict"

    kind: Literal["failed", "killed"]
    failure: Failure | None = field(default=None, metadata=rule(decode=_failure, sparse=True))
    node: str | None = field(default=None, metadata=rule(sparse=True))

    def check(self) -> None:
        if self.node is not None and (len(self.node) > 253 or has_control(self.node)):
            raise DecodeError("a verdict's 'node' is not a node name")
        if self.kind == "failed" and self.failure is None:
            raise DecodeError("a 'failed' verdict without its failure")

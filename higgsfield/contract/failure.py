"""A run's failure: the node and rank that failed, when by its own clock, why, and the last lines of its error.

It is made on the failing node (:func:`higgsfield.node.runs.failure.describe`, or by
the coordinator for a node that vanished), travels to the run's coordinator on node 0
and back to every node in the verdict (JSON over the coordinator's wire), and ends
in every node's record, which ``status`` shows. ``at`` is the failing side's own
time, so the coordinator names the failure that happened first rather than the ones
it caused on other nodes (ranks blocked in a collective fail when a peer dies).

Decoded once where it arrives (:meth:`Failure.from_dict`): a node of another
release, or a damaged message, gives a one-line :class:`DecodeError`, never a
``KeyError`` deep in the supervisor. A failure without a ``version`` is an earlier
release's, of this same shape.

Use::

    f = Failure(node="gpu-2", rank=5, at=time.time(), reason="rank 5: CUDA error", tail=["..."])
    wire.send({"t": "failed", "failure": f.to_dict()}); Failure.from_dict(msg["failure"]).reason
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from higgsfield.contract.decode import DecodeError, from_fields, tail
from higgsfield.contract.text import has_control, shown

FAILURE_VERSION = 1
MAX_REASON = 2000


@dataclass(frozen=True)
class Failure:
    """Which node and rank failed first (``rank`` None: the node's launcher itself, or a lost node)."""

    node: str | None
    rank: int | None
    at: float
    reason: str
    tail: list[str] = field(default_factory=list)
    lost: bool = False
    """The node vanished (a dead machine, a dead supervisor): on a tie in ``at`` it is named first."""

    def to_dict(self) -> dict[str, Any]:
        return {"version": FAILURE_VERSION, **asdict(self), "tail": list(self.tail)}

    @classmethod
    def from_dict(cls, data: object) -> Failure:
        """The failure in ``data``; :class:`DecodeError` names what is wrong, in one line."""
        if isinstance(data, dict) and data.get("version", FAILURE_VERSION) != FAILURE_VERSION:
            raise DecodeError(f"a failure of version {shown(data.get('version'))} (this higgsfield reads "
                              f"{FAILURE_VERSION}): upgrade higgsfield on every node of the run")
        f = from_fields(cls, data, special={"tail": tail}, what="a failure")
        if f.rank is not None and f.rank < 0:
            raise DecodeError(f"'rank' {f.rank} is not a rank")
        if len(f.reason) > MAX_REASON or (f.node is not None and (len(f.node) > 253 or has_control(f.node))):
            raise DecodeError("'reason' or 'node' is too long or holds a control character")
        return f

    def sort_key(self) -> tuple[float, bool]:
        """Earliest first; on a tie, a lost node before a failing one."""
        return (self.at, not self.lost)


@dataclass(frozen=True)
class Verdict:
    """How a run ended elsewhere, as the coordinator tells every node: ``failed`` (with the run's first
    failure) or ``killed`` (``node``: where ``higgsfield kill`` reached first)."""

    kind: str
    failure: Failure | None = None
    node: str | None = None

    def to_message(self, t: str) -> dict[str, Any]:
        """The coordinator's ``abort`` or ``verdict`` message carrying this verdict."""
        msg: dict[str, Any] = {"t": t, "kind": self.kind}
        if self.failure is not None:
            msg["failure"] = self.failure.to_dict()
        if self.node is not None:
            msg["node"] = self.node
        return msg

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> Verdict:
        """The verdict in an ``abort`` or ``verdict`` message; :class:`DecodeError` in one line."""
        kind = msg.get("kind")
        if kind not in ("failed", "killed"):
            raise DecodeError(f"a verdict of kind {shown(kind)}")
        node = msg.get("node")
        if node is not None and (not isinstance(node, str) or len(node) > 253 or has_control(node)):
            raise DecodeError("a verdict's 'node' is not a node name")
        failure = Failure.from_dict(msg["failure"]) if msg.get("failure") is not None else None
        if kind == "failed" and failure is None:
            raise DecodeError("a 'failed' verdict without its failure")
        return cls(kind, failure, node)

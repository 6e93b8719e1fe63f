"""One node's part of a run, as a :class:`~higgsfield.contract.runstatus.RunStatus` holds it: typed, never a dict.

A run's status maps each of its nodes to a :class:`NodePart`: what every view of the
run reads of that node (its state, the slots it holds, its exit code and times, the
stall its supervisor recorded). The SSH nodes' merge makes one from each node's
decoded record (a :class:`~higgsfield.contract.noderuns.NodeRunView`, whose stall is
decoded already); a backend that has no per-node records (a scheduler) knows only the
state, and leaves the rest None (unknown, not zero): the dashboard shows None as "–",
and ``status --json`` prints only the states (``node_states``).

It imports only the stall's type, so ``runstatus`` can import it (no cycles).

Use::

    part = NodePart(state="running", slots=(0, 1), stall=view.stall)
    part.state, part.slots, part.stall    # "running", (0, 1), Diagnosis | None
    stall_of(data.get("stall"))           # a stall still in its JSON: Diagnosis, or None if it does not decode
"""

from __future__ import annotations

from dataclasses import dataclass

from higgsfield.contract.codec import decode
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.stacks import Diagnosis


@dataclass(frozen=True)
class NodePart:
    """What the views of a run read of one node's part of it (None: the backend does not know it)."""

    state: str | None
    slots: tuple[int, ...] | None = None
    """The GPU indices (or CPU slots) the run holds there."""
    nproc: int | None = None
    exclusive: bool | None = None
    exit_code: int | None = None
    reason: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    stall: Diagnosis | None = None
    """The diagnosis at the run's latest stall, as this node recorded it."""
    stalled_at: float | None = None


def stall_of(v: object) -> Diagnosis | None:
    """A recorded stall's diagnosis (its JSON), decoded; None when there is none or it does not decode (a
    damaged stall hides only itself, never the run)."""
    if v is None:
        return None
    try:
        return decode(Diagnosis, v)
    except DecodeError:
        return None

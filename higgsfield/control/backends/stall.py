"""A run's stall, as its nodes recorded it: what ``status``, ``status --json``, ``run`` and the dashboard show.

When no rank of a run progresses within its ``stall_timeout``, the run's supervisors
agree on it through the coordinator, take every rank's stack and write the diagnosis
(:class:`~higgsfield.contract.stacks.Diagnosis`) into each node's run record (``stall``,
with ``stalled_at``). A backend's :class:`~higgsfield.contract.runstatus.RunStatus` keeps each
node's part in ``nodes`` (:class:`~higgsfield.contract.nodepart.NodePart`, its stall decoded once by
the merge); this reads the diagnosis back from them, so every view of a run shows the same words
whichever backend holds it.

Use::

    d = diagnosis_of(status)            # a Diagnosis, or None when the run never stalled
    view = stall_fields(status)         # {"stall": {...} | None, "stalled_at": float | None}
"""

from __future__ import annotations

from typing import Any

from higgsfield.contract.codec import encode
from higgsfield.contract.runstatus import RunStatus
from higgsfield.contract.stacks import Diagnosis


def diagnosis_of(status: RunStatus) -> Diagnosis | None:
    """The diagnosis of ``status``'s stall: the first node part holding one, else the run's own (a scheduler's
    nodes know only their state, so a Slurm run's diagnosis is the job's, in ``status.stall``), else None."""
    return next((p.stall for p in status.nodes.values() if p.stall is not None), status.stall)


def stalled_at(status: RunStatus) -> float | None:
    """When the run was found stalled (the earliest node part's ``stalled_at``), else None."""
    times = [p.stalled_at for p in status.nodes.values() if p.stalled_at is not None]
    return min(times) if times else None


def stall_fields(status: RunStatus) -> dict[str, Any]:
    """What ``status --json`` and the dashboard add to a run: ``stall`` (the diagnosis) and ``stalled_at``."""
    d = diagnosis_of(status)
    return {"stall": encode(d), "stalled_at": stalled_at(status)}

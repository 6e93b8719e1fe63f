"""A slow rank, named by its own work: what a rank reports, and what the run's nodes find.

Both sides read it: the training library writes each rank's :class:`RankWork` line
(:func:`work_line`, to ``RUN_DIR/progress/work<RANK>``: :func:`higgsfield.contract.layout.work_path`),
the node reads it back (:func:`parse_work`) and sends it to the run's coordinator in its
``progress`` message; the coordinator's rule
(:mod:`higgsfield.node.gang.stragglers`) names a :class:`Straggler`, every node keeps the
finding in its record, and ``status --json`` prints it (``stragglers``).

*Own work* is the step time less the time the rank waited in collectives: with a
collective in every step every rank's step takes as long as the slowest rank's, so step
times cannot tell the ranks apart, while the time each one spends on its own part can
(:mod:`higgsfield._lib.straggler_probe` measures it).

Use::

    line = work_line(RankWork(rank=3, step=120, steps=4, own_s=0.31, step_s=0.42), at=time.time())
    parse_work(line)                       # RankWork(rank=3, step=120, ...) (the rank from the file name)
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import ClassVar

from higgsfield.contract.codec import rule

WORK_LINE = 79   # bytes of a work line before its newline: a reader sees the old line or the new one


class OnStraggler(str, enum.Enum):
    """What a run does when a rank is named a straggler."""

    WARN = "warn"
    """Name it: the run's record, ``status``, the dashboard and the ``straggler`` notify event."""
    REPLACE = "replace"
    """Name it, and when a spare stands by, go on without its node as if it were lost: the spare takes its
    place from the last checkpoint (:mod:`higgsfield.node.gang.recovery`). Node 0, which hosts the coordinator,
    is named but not replaced; with no spare free it is named only."""

    def __str__(self) -> str:
        return self.value


ON_STRAGGLER_CHOICES: tuple[str, ...] = tuple(c.value for c in OnStraggler)


def _finite(v: object) -> None:
    if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError("is not a finite figure >= 0")


@dataclass(frozen=True)
class RankWork:
    """One rank's latest report: over the ``steps`` steps up to ``step``, the mean step time and the mean own work
    (the step time less its waits in collectives), in seconds; ``node``: filled by the coordinator."""

    WHAT: ClassVar[str] = "rank work"

    rank: int
    step: int
    steps: int
    own_s: float = field(metadata=rule(check=_finite))
    step_s: float = field(metadata=rule(check=_finite))
    node: str = ""


@dataclass(frozen=True)
class Straggler:
    """A rank whose own work per step stayed well above the run's median (the rule:
    :mod:`higgsfield.node.gang.stragglers`): which rank on which node, how much slower, since which step."""

    WHAT: ClassVar[str] = "straggler"

    node: str
    rank: int
    ratio: float
    """Its own work per step over the median of the other ranks' (1.3: 30% slower)."""
    since_step: int
    """The first step of the stretch that named it."""
    step: int
    """The latest step it reported."""
    own_s: float
    median_s: float
    at: float
    """When the coordinator named it (its clock)."""

    @property
    def summary(self) -> str:
        return (f"rank {self.rank} on {self.node} is {self.ratio:.2f}x slower than the median rank "
                f"({self.own_s * 1e3:.0f} ms of own work per step against {self.median_s * 1e3:.0f} ms) "
                f"since step {self.since_step}")


def work_line(w: RankWork, at: float) -> bytes:
    """The fixed-width line a rank writes (``STEP STEPS OWN_S STEP_S UNIXTIME``), newline included."""
    text = f"{int(w.step)} {int(w.steps)} {w.own_s:.6f} {w.step_s:.6f} {at:.3f}"
    return text[:WORK_LINE].ljust(WORK_LINE).encode() + b"\n"


def parse_work(rank: int, data: bytes) -> tuple[RankWork, float] | None:
    """A work line read back, with its time; None when it is absent, half-written or not ours."""
    try:
        step, steps, own, step_s, at = data.split()[:5]
        w = RankWork(rank=int(rank), step=int(step), steps=int(steps), own_s=float(own), step_s=float(step_s))
        t = float(at)
    except ValueError:
        return None
    if w.steps < 1 or not all(math.isfinite(x) and x >= 0 for x in (w.own_s, w.step_s, t)):
        return None
    return w, t


__all__ = ["ON_STRAGGLER_CHOICES", "OnStraggler", "RankWork", "Straggler", "WORK_LINE", "parse_work", "work_line"]

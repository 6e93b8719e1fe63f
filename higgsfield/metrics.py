"""A training step's metrics as one JSON line: what the training library writes and every view reads.

Rank 0 appends one :class:`StepMetrics` per optimizer step to ``RUN_DIR/metrics.jsonl``
(:data:`METRICS_FILE`; ``RUN_DIR`` is the run's directory on node 0, which every
rank finds in ``HIGGSFIELD_RUN_DIR``). The node's ``higgsfield invoker metrics``
reads the file, ``higgsfield metrics RUN`` prints it and the dashboard plots it.
Like :mod:`higgsfield.runspec` this module is stdlib-only and neutral: the training
library (torch), the node agent and the control side all import it.

A restarted worker appends again from its checkpoint's step, so a step can appear
twice; a reader keeps the last line of each step (:func:`latest_per_step`).

Use::

    m = StepMetrics(step=3, loss=2.1, tokens_per_s=5400.0, step_time_s=0.19, lr=3e-4)
    line = m.to_json()                       # one line, no newline
    StepMetrics.from_dict(json.loads(line))  # back (unknown keys ignored: a newer writer)
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

METRICS_FILE = "metrics.jsonl"
RUN_DIR_ENV = "HIGGSFIELD_RUN_DIR"


@dataclass
class StepMetrics:
    """What one optimizer step did. ``mfu`` and ``peak_memory_gib`` are None on CPU, ``lr`` when not given."""

    step: int
    loss: float
    tokens_per_s: float
    step_time_s: float
    mfu: float | None = None
    peak_memory_gib: float | None = None
    lr: float | None = None
    time: float = field(default_factory=time.time)   # UNIX time the step ended (the writer's clock)

    def __str__(self) -> str:
        s = f"step {self.step:6d} | loss {self.loss:.4f} | {self.tokens_per_s:,.0f} tok/s"
        if self.lr is not None:
            s += f" | lr {self.lr:.2e}"
        if self.mfu is not None:
            s += f" | mfu {100 * self.mfu:.1f}%"
        if self.peak_memory_gib is not None:
            s += f" | mem {self.peak_memory_gib:.1f} GiB"
        return s

    def to_dict(self) -> dict[str, Any]:
        """JSON values only: a non-finite float (a diverged loss) becomes null, which JSON can carry."""
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepMetrics:
        """The metrics in ``d``; raises ValueError for a line that is not a step's metrics."""
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        known = {f.name for f in fields(cls)}
        try:
            values = {k: v for k, v in d.items() if k in known}
            m = cls(**values)
            m.step = int(m.step)
            m.loss = float("nan") if m.loss is None else float(m.loss)
            m.tokens_per_s = float(m.tokens_per_s)
            m.step_time_s = float(m.step_time_s)
        except (TypeError, ValueError) as e:
            raise ValueError(f"not a step's metrics: {e}") from None
        return m


def parse_lines(lines: Iterable[str]) -> list[StepMetrics]:
    """The metrics of ``lines`` (JSON lines); a torn or foreign line is skipped."""
    out = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            out.append(StepMetrics.from_dict(json.loads(line)))
        except ValueError:
            continue
    return out


def latest_per_step(metrics: Iterable[StepMetrics]) -> list[StepMetrics]:
    """One entry per step, the last written (a restarted worker repeats steps), in step order."""
    by_step: dict[int, StepMetrics] = {}
    for m in metrics:
        by_step[m.step] = m
    return [by_step[s] for s in sorted(by_step)]

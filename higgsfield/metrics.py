"""A training step's metrics as one JSON line: what the training library writes and every view reads.

Rank 0 appends one :class:`StepMetrics` per optimizer step to ``RUN_DIR/metrics.jsonl``
(:data:`METRICS_FILE`; ``RUN_DIR`` is the run's directory on node 0, which every
rank finds in ``HIGGSFIELD_RUN_DIR``). The node's ``higgsfield invoker metrics``
reads the file, ``higgsfield metrics RUN`` prints it and the dashboard plots it.
Like :mod:`higgsfield.contract.runspec` this module is stdlib-only and neutral: the training
library (torch), the node agent and the control side all import it.

A restarted worker appends again from its checkpoint's step, so a step can appear
twice; a reader keeps the last line of each step (:func:`latest_per_step`).

A line is decoded once, strictly (:func:`decode_line`, through :func:`higgsfield.contract.codec.decode`): a line that is not JSON, not an
object, too long, or holds a value of the wrong kind (a string ``lr``, a negative
``step``, a list for a number, NaN where only a finite number makes sense) is not a
step's metrics. Readers skip such lines and *count* them (:class:`Skipped`), so a view
can say "3 lines skipped" instead of failing or silently showing less. Over the
invoker's output a count travels as a ``#skipped N`` line (:func:`skipped_line`), as a
heartbeat does as ``#hb``.

Use::

    m = StepMetrics(step=3, loss=2.1, tokens_per_s=5400.0, step_time_s=0.19, lr=3e-4)
    line = m.to_json()                       # one line, no newline
    decode_line(line)                        # back (unknown keys ignored: a newer writer)
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from higgsfield.contract.codec import DecodeError, decode, encode, rule
from higgsfield.contract.layout import RUN_DIR_VAR

METRICS_FILE = "metrics.jsonl"
RUN_DIR_ENV = RUN_DIR_VAR
MAX_LINE_BYTES = 64 * 1024   # a step's line is ~200 bytes: anything this long is not one (and is not parsed)
MAX_STEP = 2**53             # the largest step a JSON number carries exactly (and a browser's too)
HEARTBEAT_LINE = "#hb"
SKIPPED_PREFIX = "#skipped "


def _step(v: object) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise DecodeError("'step' is not a whole number")
    if not 0 <= v <= MAX_STEP:
        raise DecodeError(f"'step' {v} is out of range (0..2**53)")
    return v


def _loss(v: object) -> float:
    """A loss: any number, non-finite too (a diverged loss is a real point, drawn as a gap)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise DecodeError("'loss' is not a number")
    try:
        return float(v)
    except OverflowError:
        raise DecodeError("'loss' is out of range") from None


def _not_negative(x: float) -> None:
    if x < 0:
        raise ValueError("is negative")


@dataclass
class StepMetrics:
    """What one optimizer step did. ``mfu`` and ``peak_memory_gib`` are None on CPU, ``lr`` when not given.

    Decoded with :func:`higgsfield.contract.codec.decode` (:func:`decode_line`): ``loss`` may be
    null or non-finite; ``tokens_per_s`` and ``step_time_s`` must be finite and >= 0; the
    optional figures are null or finite. Unknown keys are ignored (a newer writer), a missing
    ``time`` is now.
    """

    WHAT: ClassVar[str] = "step's metrics"

    step: int = field(metadata=rule(decode=_step))
    loss: float = field(metadata=rule(decode=_loss))
    tokens_per_s: float = field(metadata=rule(check=_not_negative))
    step_time_s: float = field(metadata=rule(check=_not_negative))
    mfu: float | None = None
    peak_memory_gib: float | None = None
    lr: float | None = None
    time: float = field(default_factory=time.time)   # UNIX time the step ended (the writer's clock)
    #: bytes the run's ranks sent between nodes in this step, all ranks together, and the seconds rank 0 spent
    #: sending them: metered where higgsfield makes the cross-node collectives itself (DiLoCo), else None
    cross_node_bytes: float | None = None
    comm_s: float | None = None

    def __str__(self) -> str:
        s = f"step {self.step:6d} | loss {self.loss:.4f} | {self.tokens_per_s:,.0f} tok/s"
        if self.lr is not None:
            s += f" | lr {self.lr:.2e}"
        if self.mfu is not None:
            s += f" | mfu {100 * self.mfu:.1f}%"
        if self.peak_memory_gib is not None:
            s += f" | mem {self.peak_memory_gib:.1f} GiB"
        if self.cross_node_bytes:
            s += f" | cross-node {self.cross_node_bytes / 1e6:,.1f} MB in {self.comm_s or 0:.2f} s"
        return s

    def to_json(self) -> str:
        """One line of ``metrics.jsonl`` (:func:`point`'s JSON)."""
        return json.dumps(point(self), separators=(",", ":"))


def point(m: StepMetrics) -> dict[str, Any]:
    """``m`` encoded, JSON values only: a non-finite float (a diverged loss) becomes null, which JSON can carry."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in encode(m).items()}


@dataclass(frozen=True)
class Skipped:
    """How many lines of a run's metrics file were not a step's metrics, so far (a running total)."""

    count: int

    def __str__(self) -> str:
        return f"{self.count} line{'' if self.count == 1 else 's'} skipped (not a metrics record)"


#: What a metrics reader yields: a step, a new skipped total, or None (a heartbeat: the run is quiet).
MetricsItem = StepMetrics | Skipped | None


def decode_line(line: str | bytes) -> StepMetrics:
    """One line of ``metrics.jsonl`` as a step's metrics; ValueError (one line, why) for anything else."""
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(f"longer than {MAX_LINE_BYTES} bytes")
    try:
        d = json.loads(line)
    except RecursionError:      # deeply nested brackets: json gives up by recursion, not ValueError
        raise ValueError("nested too deeply") from None
    except ValueError as e:     # JSONDecodeError, bad UTF-8, an integer of too many digits
        raise ValueError(f"not JSON: {e}") from None
    if isinstance(d, dict) and "loss" in d and d["loss"] is None:
        d = {**d, "loss": math.nan}     # a diverged loss, as the writer writes it: a real point, drawn as a gap
    try:
        return decode(StepMetrics, d)
    except DecodeError as e:
        raise ValueError(f"not a step's metrics: {e}") from None


def skipped_line(count: int) -> str:
    """The invoker's line that carries a skipped total (a reader that predates it skips it: not JSON)."""
    return f"{SKIPPED_PREFIX}{count}"


def parse_skipped(line: str) -> int | None:
    """The total of a :func:`skipped_line`, or None when ``line`` is not one."""
    if not line.startswith(SKIPPED_PREFIX):
        return None
    text = line[len(SKIPPED_PREFIX):]
    return int(text) if text.isascii() and text.isdigit() and len(text) < 20 else None


def decode_lines(lines: Iterable[str]) -> tuple[list[StepMetrics], int]:
    """The metrics of ``lines`` (JSON lines) and how many lines were skipped (blank lines are not counted)."""
    out = []
    skipped = 0
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            out.append(decode_line(line))
        except ValueError:
            skipped += 1
    return out, skipped


def parse_lines(lines: Iterable[str]) -> list[StepMetrics]:
    """The metrics of ``lines`` (JSON lines); a torn or foreign line is skipped (:func:`decode_lines` counts them)."""
    return decode_lines(lines)[0]


def latest_per_step(metrics: Iterable[StepMetrics]) -> list[StepMetrics]:
    """One entry per step, the last written (a restarted worker repeats steps), in step order."""
    by_step: dict[int, StepMetrics] = {}
    for m in metrics:
        by_step[m.step] = m
    return [by_step[s] for s in sorted(by_step)]

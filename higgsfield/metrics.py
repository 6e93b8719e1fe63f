"""A training step's metrics as one JSON line: what the training library writes and every view reads.

Rank 0 appends one :class:`StepMetrics` per optimizer step to ``RUN_DIR/metrics.jsonl``
(:data:`METRICS_FILE`; ``RUN_DIR`` is the run's directory on node 0, which every
rank finds in ``HIGGSFIELD_RUN_DIR``). The node's ``higgsfield invoker metrics``
reads the file, ``higgsfield metrics RUN`` prints it and the dashboard plots it.
Like :mod:`higgsfield.contract.runspec` this module is stdlib-only and neutral: the training
library (torch), the node agent and the control side all import it.

A restarted worker appends again from its checkpoint's step, so a step can appear
twice; a reader keeps the last line of each step (:func:`latest_per_step`).

A line is decoded once, strictly (:func:`decode_line`): a line that is not JSON, not an
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
from dataclasses import asdict, dataclass, field
from typing import Any

from higgsfield.contract.layout import RUN_DIR_VAR

METRICS_FILE = "metrics.jsonl"
RUN_DIR_ENV = RUN_DIR_VAR
MAX_LINE_BYTES = 64 * 1024   # a step's line is ~200 bytes: anything this long is not one (and is not parsed)
MAX_STEP = 2**53             # the largest step a JSON number carries exactly (and a browser's too)
HEARTBEAT_LINE = "#hb"
SKIPPED_PREFIX = "#skipped "


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
    def from_dict(cls, d: Any) -> StepMetrics:
        """The metrics in ``d``, each value checked for its kind; raises ValueError for anything else.

        ``loss`` may be null or non-finite (a diverged loss is a real point, drawn as a gap);
        ``tokens_per_s`` and ``step_time_s`` must be finite and >= 0; the optional figures are
        null or finite. Unknown keys are ignored (a newer writer), a missing ``time`` is now.
        """
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        missing = [k for k in ("step", "loss", "tokens_per_s", "step_time_s") if k not in d]
        if missing:
            raise ValueError(f"no '{missing[0]}'")
        when = _number(d, "time", optional=True)
        return cls(step=_step(d["step"]),
                   loss=_loss(d["loss"]),
                   tokens_per_s=_rate(d, "tokens_per_s"),
                   step_time_s=_rate(d, "step_time_s"),
                   mfu=_number(d, "mfu", optional=True),
                   peak_memory_gib=_number(d, "peak_memory_gib", optional=True),
                   lr=_number(d, "lr", optional=True),
                   time=time.time() if when is None else when)


@dataclass(frozen=True)
class Skipped:
    """How many lines of a run's metrics file were not a step's metrics, so far (a running total)."""

    count: int

    def __str__(self) -> str:
        return f"{self.count} line{'' if self.count == 1 else 's'} skipped (not a metrics record)"


#: What a metrics reader yields: a step, a new skipped total, or None (a heartbeat: the run is quiet).
MetricsItem = StepMetrics | Skipped | None


def _float(key: str, v: Any) -> float:
    """``v`` as a float if it is a JSON number (never a bool, a string or a container)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"'{key}' is not a number")
    try:
        return float(v)
    except OverflowError:
        raise ValueError(f"'{key}' is out of range") from None


def _number(d: dict[str, Any], key: str, *, optional: bool) -> float | None:
    v = d.get(key)
    if v is None and optional:
        return None
    x = _float(key, v)
    if not math.isfinite(x):
        raise ValueError(f"'{key}' is not finite")
    return x


def _step(v: Any) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError("'step' is not a whole number")
    if not 0 <= v <= MAX_STEP:
        raise ValueError(f"'step' {v} is out of range (0..2**53)")
    return v


def _loss(v: Any) -> float:
    return float("nan") if v is None else _float("loss", v)


def _rate(d: dict[str, Any], key: str) -> float:
    x = _number(d, key, optional=False)
    assert x is not None
    if x < 0:
        raise ValueError(f"'{key}' is negative")
    return x


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
    try:
        return StepMetrics.from_dict(d)
    except ValueError as e:
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

"""``higgsfield status``'s table, laid out for the width it has: the run name is never cut.

Users copy a run's name into ``logs`` and ``kill``, so it is printed whole whatever
the width (a line may then be wider than the terminal). What gives way, in order,
until the table fits: the start time (``2026-12-01 18:30:05`` -> ``12-01 18:30``), the
first failure and the node list (cut with "…"; failures are printed whole under the
table), then whole columns: experiment (a run's name starts with it), first failure,
nodes, duration, exit code, start time. Columns are as wide as their widest cell, so
they stay put from row to row.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from higgsfield.contract.runstatus import RunStatus
from higgsfield.contract.text import one_line

GAP = 2
ELLIPSIS = "…"


@dataclass
class Column:
    title: str
    cells: list[str]
    shrink_to: int | None = None     # may be cut to this width (None: never cut)

    @property
    def width(self) -> int:
        return max([len(self.title), *(len(c) for c in self.cells)])


def fmt_time(t: float | None, *, short: bool = False) -> str:
    if not t:
        return "-"
    return time.strftime("%m-%d %H:%M" if short else "%Y-%m-%d %H:%M:%S", time.localtime(t))


def fmt_duration(d: float | None) -> str:
    if d is None:
        return "-"
    d = int(d)
    return f"{d // 3600}h{d % 3600 // 60:02d}m" if d >= 3600 else f"{d // 60}m{d % 60:02d}s"


def failure_of(r: RunStatus) -> str:
    if not r.failed_node:
        return ""
    return r.failed_node + (f" rank {r.failed_rank}" if r.failed_rank is not None else "")


def columns(runs: Sequence[RunStatus], *, short_dates: bool = False) -> dict[str, Column]:
    return {
        "RUN": Column("RUN", [r.run for r in runs]),
        "EXPERIMENT": Column("EXPERIMENT", [r.experiment for r in runs]),
        "STATE": Column("STATE", [r.state for r in runs]),
        "NODES": Column("NODES", [",".join(r.nodes) for r in runs], shrink_to=12),
        "STARTED": Column("STARTED", [fmt_time(r.started_at, short=short_dates) for r in runs]),
        "DURATION": Column("DURATION", [fmt_duration(r.duration) for r in runs]),
        "EXIT": Column("EXIT", ["" if r.exit_code is None else str(r.exit_code) for r in runs]),
        "FIRST FAILURE": Column("FIRST FAILURE", [failure_of(r) for r in runs], shrink_to=13),
    }


DROP_ORDER = ("EXPERIMENT", "FIRST FAILURE", "NODES", "DURATION", "EXIT", "STARTED")


def layout(runs: Sequence[RunStatus], width: int) -> tuple[list[str], list[int], list[list[str]]]:
    """The titles, widths and rows (cells cut to fit) of the table for ``runs`` within ``width`` columns."""
    cols = columns(runs)
    widths = {name: c.width for name, c in cols.items()}

    def total() -> int:
        return sum(widths.values()) + GAP * (len(widths) - 1)

    if total() > width:
        cols = columns(runs, short_dates=True)
        widths = {name: c.width for name, c in cols.items()}
    for name in ("FIRST FAILURE", "NODES"):
        c = cols[name]
        if total() > width and c.shrink_to is not None:
            widths[name] = max(c.shrink_to, len(c.title), widths[name] - (total() - width))
            widths[name] = min(widths[name], c.width)
    for name in DROP_ORDER:
        if total() <= width:
            break
        del widths[name]
    for name in ("NODES", "FIRST FAILURE"):   # a column dropped may leave room for one cut before
        if name in widths:
            widths[name] = min(cols[name].width, widths[name] + max(0, width - total()))
    titles = list(widths)
    rows = [[_cut(cols[t].cells[i], widths[t]) for t in titles] for i in range(len(runs))]
    return titles, [widths[t] for t in titles], rows


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(width - 1, 0)] + ELLIPSIS


MAX_WARNINGS = 20


def skip_warnings(skipped: Sequence[str]) -> list[str]:
    """The lines ``status`` prints on stderr for the files nodes skipped (``warning: node1: skipped
    runs/p/x/run.json: not JSON (...)``): each inert on a terminal, and a node full of damaged files
    costs ``MAX_WARNINGS`` lines and a count, not a screen per file."""
    out = [f"warning: {one_line(line, 500)}" for line in skipped[:MAX_WARNINGS]]
    if len(skipped) > MAX_WARNINGS:
        out.append(f"warning: {len(skipped) - MAX_WARNINGS} more file(s) skipped")
    return out

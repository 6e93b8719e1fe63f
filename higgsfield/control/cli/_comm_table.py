"""How ``doctor --fabric`` prints each experiment's step priced on the measured link (after the fabric tables).

The rows are :func:`higgsfield.control.doctor.comm_advice.project_rows`'s; the cost model and its
assumptions are :mod:`higgsfield.contract.comm_cost`'s (docs/doctor-fabric.md). ``--json`` carries
the same rows under ``comm``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from higgsfield.contract import comm_cost as cc
from higgsfield.control.doctor.comm_advice import Row


def _time(s: float, compute: float | None) -> str:
    text = f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"
    if compute is None:
        return text
    share = s / (s + compute) if s + compute > 0 else 0.0
    return f"{text} ({share:.0%})" if share <= cc.HALF else f"[bold red]{text} ({share:.0%})[/]"


def render_comm(out: Any, rows: Sequence[Row], unknown: Sequence[str], note: str = "") -> None:
    """The table (nothing when there is no row), then what could not be priced, one line each."""
    from rich.markup import escape
    from rich.table import Table

    if rows:
        labels = [e.label for e in rows[0].estimates]
        t = Table(title=f"communication per step, estimated on this link ({rows[0].nodes} nodes x "
                        f"{rows[0].ranks_per_node} ranks; % of a step where the compute is known)",
                  title_justify="left")
        for col in ("experiment", "params", "compute (est.)", *labels, "cross-node bytes (full / DiLoCo)"):
            t.add_column(col)
        for r in rows:
            full, dl = r.estimates[0].cross_bytes, r.estimates[-1].cross_bytes
            t.add_row(escape(r.experiment), f"{cc.size_text(r.params)} ({escape(r.source)})",
                      "n/a" if r.compute_s is None else _time(r.compute_s, None),
                      *(_time(e.seconds, r.compute_s) for e in r.estimates),
                      f"{full / 1e9:.3g} / {dl / 1e9:.3g} GB" + (f" ({full / dl:.0f}x)" if dl else ""))
        out.print(t)
        out.print("[dim]ring collectives on the measured busbw, no overlap with compute; compute at an assumed "
                  "40% of the GPU's bf16 peak (docs/doctor-fabric.md)[/]")
    if unknown:
        out.print(f"[dim]no model size known for {escape(', '.join(unknown))}: give them a 'size' param (7b) or "
                  "use --model SIZE[/]")
    if note:
        out.print(f"[dim]{escape(note)}[/]")

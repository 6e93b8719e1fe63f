"""How ``doctor --fabric`` prints its figures: nccl-tests' all-reduce table, the nodes, the pairs, the outlier.

Every number printed here is in ``--json`` too (the encoded :class:`FabricResult`, docs/doctor-fabric.md),
with the same units: time in microseconds, bandwidth in GB/s (10^9 bytes a second), write
throughput in MB/s.
"""

from __future__ import annotations

from typing import Any

from higgsfield.contract.fabric import FabricResult, GpuRow


def size_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def _gb(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _gpus(gpus: list[GpuRow] | None) -> tuple[str, str]:
    if gpus is None:
        return "n/a", "n/a"
    free = ", ".join(f"{g.free_mib / 1024:.1f}/{g.total_mib / 1024:.0f} GiB" for g in gpus)
    bad = [f"gpu{g.index}: {g.health}" for g in gpus if not g.healthy]
    return free or "-", "; ".join(bad) or "ok"


def render(out: Any, result: FabricResult) -> None:
    """Print ``result`` on a rich console ``out``."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"all-reduce, {result.world_size} ranks on {len(result.nodes)} nodes ({result.backend})",
              title_justify="left")
    for col in ("size", "count", "time (us)", "algbw (GB/s)", "busbw (GB/s)"):
        t.add_column(col, justify="right")
    for r in result.allreduce:
        t.add_row(size_text(r.bytes), str(r.count), f"{r.time_us:.1f}", f"{r.algbw_gbps:.3f}", f"{r.busbw_gbps:.3f}")
    out.print(t)
    out.print(f"latency {result.latency_us:.1f} us (8 B all-reduce), peak busbw {result.peak_busbw_gbps:.3f} GB/s")

    n = Table(title="per node", title_justify="left")
    for col in ("node", "ranks", "intra busbw (GB/s)", "best link busbw (GB/s)", "ckpt write (MB/s)",
                "free GPU memory", "GPU health"):
        n.add_column(col)
    for row in result.per_node:
        free, health = _gpus(row.gpus)
        n.add_row(row.node, str(row.ranks), _gb(row.intra_busbw_gbps), _gb(row.link_busbw_gbps),
                  "n/a" if row.ckpt_write_mbps is None else f"{row.ckpt_write_mbps:.0f}", free, health)
    out.print(n)

    if result.pairs:
        p = Table(title=f"pairs ({size_text(result.pairs[0].bytes)} all-reduce each)", title_justify="left")
        for col in ("pair", "time (us)", "busbw (GB/s)"):
            p.add_column(col)
        for pr in result.pairs:
            p.add_row(f"{pr.a} - {pr.b}", f"{pr.time_us:.1f}", f"{pr.busbw_gbps:.3f}")
        out.print(p)
    for o in result.outliers:
        out.print(f"[bold red]✗[/] {escape(o.line())}")
    for line in result.unhealthy:
        out.print(f"[bold red]✗[/] {escape(line)}")
    if not result.outliers:
        out.print(f"[green]no slow node among {len(result.nodes)}[/] ({result.seconds:.1f}s, run {result.run})")

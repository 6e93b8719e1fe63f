"""The fabric test's shape: what the benchmark worker measures and what ``doctor --fabric`` reads back.

Both sides read this module: the worker (:mod:`higgsfield._lib.fabric_bench`, under torchrun)
uses the size ladder, the pair schedule and the bandwidth formulas; the control side
(:mod:`higgsfield.control.doctor.fabric`) decodes the worker's one result line into a
:class:`FabricResult` and names the slow node with :func:`outliers`. Stdlib only, so it is
unit-tested without torch or a test bed.

The figures follow nccl-tests: ``algbw = bytes / time`` and, for all-reduce,
``busbw = algbw * 2 (n - 1) / n`` over ``n`` ranks, in GB/s (10^9 bytes a second), time in
microseconds. The worker prints its result as one log line, ``MARKER`` then the JSON of
its :class:`FabricResult` (``codec.encode``: the documented shape of ``doctor --fabric --json``,
docs/doctor-fabric.md), which the control side decodes (``codec.decode``).

Use::

    sizes(8, 64 << 20)                       # [8, 32, 128, ..., 33554432, 67108864]
    rounds(["a", "b", "c"])                  # [[("a","c")], [("a","b")], [("b","c")]]-like: every pair once
    result = decode(FabricResult, json.loads(line[len(MARKER):]))
    outliers(result.pairs)                   # [Outlier(node="c", ...)] when c's every link is slow
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from higgsfield.contract.codec import rule

MARKER = "HIGGSFIELD_FABRIC "
"""The prefix of the worker's one result line in rank 0's log."""

EXPERIMENT = "higgsfield_fabric"
MODULE = "higgsfield._lib.fabric_bench"
VERSION = 1

MIN_BYTES = 8
MAX_BYTES = 64 << 20
PAIR_BYTES = 4 << 20
"""The message each pair of nodes all-reduces in the pairwise step (big enough to show bandwidth)."""
ALL_PAIRS_UP_TO = 16
"""Up to this many nodes every pair is measured; above it, the two rings of neighbours (i, i+1) and (i, i+2)."""
SLOW_RATIO = 0.5
"""A node whose best link is below this fraction of the median node's is the outlier."""


def sizes(lo: int = MIN_BYTES, hi: int = MAX_BYTES) -> list[int]:
    """Message sizes from ``lo`` by powers of 4 up to ``hi`` (``hi`` itself always last), as nccl-tests steps."""
    if lo < 4 or hi < lo:
        raise ValueError(f"sizes: need 4 <= lo <= hi, got {lo}..{hi}")
    out, s = [], lo
    while s < hi:
        out.append(s)
        s *= 4
    out.append(hi)
    return out


def iterations(size: int, gpu: bool) -> int:
    """Timed iterations for a message: many for small ones, few for big ones on CPU (keep it quick)."""
    if gpu:
        return 20 if size <= (16 << 20) else 10
    if size <= (64 << 10):
        return 20
    if size <= (4 << 20):
        return 5
    return 2


def busbw(algbw: float, ranks: int) -> float:
    """All-reduce bus bandwidth: what each link carried (nccl-tests' factor 2 (n - 1) / n)."""
    return algbw * 2 * (ranks - 1) / ranks if ranks > 1 else 0.0


def pairs_of(n: int) -> list[tuple[int, int]]:
    """The node pairs measured: all of them up to :data:`ALL_PAIRS_UP_TO` nodes, else the two neighbour rings."""
    if n < 2:
        return []
    if n <= ALL_PAIRS_UP_TO:
        return [(a, b) for a in range(n) for b in range(a + 1, n)]
    seen: set[tuple[int, int]] = set()
    for step in (1, 2):
        for a in range(n):
            b = (a + step) % n
            seen.add((min(a, b), max(a, b)))
    return sorted(seen)


def rounds(n: int) -> list[list[tuple[int, int]]]:
    """:func:`pairs_of` in rounds of disjoint pairs (greedy), so no node is in two measurements at once."""
    left = pairs_of(n)
    out: list[list[tuple[int, int]]] = []
    while left:
        busy: set[int] = set()
        this, rest = [], []
        for a, b in left:
            if a in busy or b in busy:
                rest.append((a, b))
            else:
                this.append((a, b))
                busy.update((a, b))
        out.append(this)
        left = rest
    return out


@dataclass(frozen=True)
class SizeRow:
    """One message size of the all-reduce sweep (one line of nccl-tests' table)."""

    bytes: int
    count: int              # elements (float32)
    time_us: float          # per all-reduce, the slowest rank's mean
    algbw_gbps: float
    busbw_gbps: float


@dataclass(frozen=True)
class PairRow:
    """One pair of nodes all-reducing alone: the link between them."""

    a: str
    b: str
    bytes: int
    time_us: float
    busbw_gbps: float


@dataclass(frozen=True)
class GpuRow:
    """One GPU of a node: free memory and what NVML / nvidia-smi says of its health."""

    index: int
    name: str
    free_mib: float
    total_mib: float
    health: str             # "ok", "n/a ..." (cannot tell), or what is wrong (ECC errors, throttling) as one line

    @property
    def healthy(self) -> bool:
        return self.health == "ok" or self.health.startswith("n/a")


@dataclass(frozen=True)
class NodeRow:
    """One node's own figures."""

    node: str
    ranks: int
    intra_busbw_gbps: float | None      # its ranks all-reducing among themselves; None with one rank
    link_busbw_gbps: float | None       # its best pair's (the pairwise step); None alone
    ckpt_write_mbps: float | None       # the checkpoint directory's write throughput (fsync'd)
    ckpt_dir: str
    gpus: list[GpuRow] | None           # None on a CPU node ("n/a")


@dataclass(frozen=True)
class Outlier:
    """A node whose best link is far below the median node's: the slow node (or its link)."""

    node: str
    busbw_gbps: float
    median_gbps: float
    ratio: float = field(init=False)
    """``busbw_gbps`` over ``median_gbps`` (0 without a median)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ratio", self.busbw_gbps / self.median_gbps if self.median_gbps else 0.0)

    def line(self) -> str:
        return (f"{self.node} is slow: its best link {self.busbw_gbps:.3g} GB/s busbw against the median "
                f"node's {self.median_gbps:.3g} GB/s ({self.ratio:.0%})")


def _not_from_the_node(default: Any) -> Any:
    """A field's decoder that takes nothing from the wire: the control side sets it (a node never names
    the slow node)."""
    return rule(decode=lambda _v: default() if callable(default) else default)


@dataclass(frozen=True)
class FabricResult:
    """What the benchmark measured (the JSON of ``doctor --fabric --json``; ``run`` and ``outliers`` are the
    control side's, never read from a node). ``latency_us`` and ``peak_busbw_gbps`` are computed, and written
    for the reader of the JSON."""

    WHAT: ClassVar[str] = "fabric result"
    VERSION: ClassVar[int] = VERSION
    VERSION_DEFAULT: ClassVar[int | None] = None     # the worker always writes it

    backend: str
    nodes: list[str]
    world_size: int
    allreduce: list[SizeRow]
    pairs: list[PairRow]
    per_node: list[NodeRow]
    seconds: float = 0.0
    run: str = field(default="", metadata=_not_from_the_node(""))   # the benchmark's run name
    outliers: list[Outlier] = field(default_factory=list, metadata=_not_from_the_node(list))
    latency_us: float = field(init=False)
    """The smallest message's all-reduce time: the fabric's latency."""
    peak_busbw_gbps: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "latency_us", self.allreduce[0].time_us if self.allreduce else 0.0)
        object.__setattr__(self, "peak_busbw_gbps", max((r.busbw_gbps for r in self.allreduce), default=0.0))

    @property
    def unhealthy(self) -> list[str]:
        """One line per GPU that NVML / nvidia-smi says is unwell."""
        return [f"{n.node} gpu{g.index}: {g.health}" for n in self.per_node for g in n.gpus or [] if not g.healthy]


def best_links(pairs: Sequence[PairRow]) -> dict[str, float]:
    """Each node's best pair figure (busbw): a node is slow when even its best link is."""
    best: dict[str, float] = {}
    for p in pairs:
        for n in (p.a, p.b):
            best[n] = max(best.get(n, 0.0), p.busbw_gbps)
    return best


def outliers(pairs: Sequence[PairRow], ratio: float = SLOW_RATIO) -> list[Outlier]:
    """The nodes whose best link is below ``ratio`` x the median node's best link.

    Why a node's *best* link: a slow node slows every pair it is in, while a healthy node
    still has fast pairs with the other healthy nodes. With two nodes there is one link and
    nothing to compare it with, so no node is named (the table still shows the figure).
    """
    best = best_links(pairs)
    if len(best) < 3:
        return []
    median = statistics.median(best.values())
    return sorted((Outlier(n, v, median) for n, v in best.items() if v < ratio * median),
                  key=lambda o: o.busbw_gbps)

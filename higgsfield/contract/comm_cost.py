"""What one training step costs on the network, by sharding mode: the link decides, the user chooses.

``doctor --fabric`` measures the link between nodes (all-reduce busbw, nccl-tests' figure);
this module turns that figure and a model's size into the communication time of one step
under each way of spreading the model over the nodes, so the user sees what the link costs
before a run pays it, and ``run`` can say in one line when the chosen mode would spend more
than half of a step waiting on the network (:func:`advice`). Pure arithmetic, stdlib only:
the control side computes it, the training library may report the same bytes.

The model (ring collectives, the bandwidth term only):

- A ring all-gather or reduce-scatter of ``S`` bytes over ``n`` ranks moves ``S (n-1)/n``
  bytes through every link of the ring; an all-reduce twice that. nccl-tests' *busbw* is
  defined so that ``time = that traffic / busbw``, so the measured all-reduce busbw is the
  bandwidth the slowest link of the ring gives, and it serves for all three collectives.
- **full** (FSDP over every rank, ``W = nodes x ranks per node``): per step each layer's
  parameters are all-gathered in forward and again in backward (ZeRO-3; once with ZeRO-2,
  which keeps them gathered) and its gradients reduce-scattered, every collective over the
  ring of all ``W`` ranks, which crosses the network: ``(gathers x param_bytes + grad_bytes)
  x params x (W-1)/W / busbw``. With bf16 mixed precision the gathers move bf16 (2 bytes)
  and the reduce-scatter fp32 (4 bytes): 8 bytes a parameter, ~"3 x params x bytes".
- **hybrid** (HSDP: shard within a node, replicate across nodes): the same per-layer
  collectives within each node's ``P`` ranks (over the node's own busbw, ``intra``, when it
  was measured; taken as free otherwise, NVLink being ~100x the network), then one
  all-reduce of the gradient shards across the nodes: ``P`` all-reduces of ``1/P`` of the
  gradients in parallel through one network link, ``2 (N-1)/N x params x grad_bytes / busbw``.
- **replicate** (DDP): one all-reduce of the whole gradient over all ``W`` ranks.
- **diloco** (DiLoCo(H), arXiv 2311.08105): the inner steps as hybrid within each node (the
  intra term, every step), and every ``H`` steps one all-reduce of the pseudo-gradient
  (``params x pg_bytes``: 4 fp32, 2 bf16, 1 int8 when quantized) across the nodes; per step
  that is ``2 (N-1)/N x params x pg_bytes / busbw / H``.

What it leaves out, on purpose: latency (each collective's ``(n-1) x alpha``; small against
the bandwidth term for models of 100M parameters and more, whose layers are megabytes),
the overlap of communication with compute (FSDP prefetches the next layer's all-gather, so a
step can hide some of it: the estimate is the time the link is busy, an upper bound of the
time lost), NCCL's tree algorithms and several NICs a node (both in the measured busbw when
``doctor --fabric`` ran on the same nodes), and stragglers.

The step's compute, when no step time was measured: ``6 x params x tokens`` FLOPs a rank
(forward 2, backward 4; activation checkpointing adds a forward, 8) at :func:`achieved_flops`
(an assumed 40% of the GPU's dense bf16 peak, :data:`PEAK_FLOPS`; a CPU rank
:data:`CPU_FLOPS`). A step is compute plus communication (no overlap, as above).

Use::

    model_size("7b")                                           # 7e9 (None: not a size)
    link = Link(cross_gbps=1.2)                                # GB/s, doctor --fabric's busbw
    setup = Setup(params=7e9, nodes=2, ranks_per_node=8)
    [e.seconds for e in estimate_all(setup, link)]             # full, hybrid, diloco(50)
    advice("full", estimate_all(setup, link), compute_s=1.5)   # one line, or None
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

MODES = ("full", "hybrid", "replicate", "diloco")
"""The ways across nodes this module prices (``Llama(sharding=...)``'s three, and DiLoCo)."""
DEFAULT_H = 50
"""DiLoCo's inner steps between two outer steps, when not said (the paper's 500 is for 8 workers and
weeks; 50 keeps the outer step frequent while cutting the traffic 50x)."""
HALF = 0.5
"""``run`` speaks up when the chosen mode's communication is over this share of a step."""

PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "A10": 125e12, "L40": 181e12, "4090": 165e12}
"""Peak dense bf16 FLOP/s per GPU, matched on the device name (what MFU divides by)."""
ASSUMED_MFU = 0.4
"""The share of the peak a step is taken to reach when none was measured (a tuned FSDP run on one node
reaches 40-55%; less is assumed, so a step is not taken as shorter than it is)."""
UNKNOWN_GPU_FLOPS = 100e12
"""A GPU not in :data:`PEAK_FLOPS` is taken to reach this."""
CPU_FLOPS = 50e9
"""A CPU rank (torch on a few cores, fp32) is taken to reach this."""

BYTES = {"fp32": (4, 4), "bf16": (2, 4), "fp16": (2, 4), "bf16_pure": (2, 2)}
"""``Llama(precision=...)`` -> (bytes of a gathered parameter, bytes of a reduced gradient): mixed precision
gathers in 16 bits and reduces in fp32 (its MixedPrecisionPolicy); bf16_pure is bf16 throughout."""

_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)([kmbt])", re.IGNORECASE)
_SCALE = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}
SIZE_FORMS = "125m, 1b, 1.3b, 7b, 70b"


def model_size(text: str) -> float | None:
    """A parameter count as people write it (``125m``, ``1.3b``, ``7B``), or None when ``text`` is not one."""
    m = _SIZE_RE.fullmatch(text.strip())
    if m is None:
        return None
    value = float(m.group(1)) * _SCALE[m.group(2).lower()]
    return value if value >= 1 else None


def size_text(params: float) -> str:
    """``7e9`` -> ``7B``, ``1.24e9`` -> ``1.24B``, ``125e6`` -> ``125M``."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if params >= scale:
            return f"{params / scale:.3g}{unit}"
    return f"{params:.0f}"


def achieved_flops(gpu_name: str | None) -> float:
    """The FLOP/s a rank is assumed to reach: 40% of a known GPU's peak; None (no GPU) is a CPU rank."""
    if gpu_name is None:
        return CPU_FLOPS
    for key, flops in PEAK_FLOPS.items():
        if key in gpu_name:
            return flops * ASSUMED_MFU
    return UNKNOWN_GPU_FLOPS


def compute_seconds(params: float, tokens_per_rank: float, flops: float, *,
                    activation_checkpointing: bool = False) -> float:
    """One step's compute on a rank: 6 (8 with activation checkpointing) x params x tokens FLOPs at ``flops``."""
    if flops <= 0:
        raise ValueError(f"flops must be positive, not {flops}")
    return (8 if activation_checkpointing else 6) * params * tokens_per_rank / flops


@dataclass(frozen=True)
class Link:
    """The measured fabric: all-reduce busbw in GB/s (10^9 bytes a second), as ``doctor --fabric`` reports it."""

    cross_gbps: float
    """Between nodes: the slowest link of a ring over every node."""
    intra_gbps: float | None = None
    """Within a node (its ranks among themselves); None: not measured, taken as free."""

    def __post_init__(self) -> None:
        if not self.cross_gbps > 0 or (self.intra_gbps is not None and not self.intra_gbps > 0):
            raise ValueError(f"busbw must be positive: cross {self.cross_gbps}, intra {self.intra_gbps}")


@dataclass(frozen=True)
class Setup:
    """What is trained where: the model's size, the nodes and ranks, the bytes a collective moves."""

    params: float
    nodes: int
    ranks_per_node: int = 1
    param_bytes: int = 2
    """A gathered parameter (bf16 under mixed precision)."""
    grad_bytes: int = 4
    """A reduced gradient (fp32 under mixed precision: ``reduce_dtype``)."""
    gathers: int = 2
    """All-gathers of the parameters a step: 2 with ZeRO-3 (forward and backward), 1 with ZeRO-2."""

    def __post_init__(self) -> None:
        if self.params <= 0 or self.nodes < 1 or self.ranks_per_node < 1:
            raise ValueError(f"a setup needs params > 0, nodes >= 1, ranks >= 1: {self}")

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass(frozen=True)
class Estimate:
    """One mode's communication in one step: the time the links are busy and the bytes a node sends out."""

    mode: str
    label: str              # "full", "hybrid", "DiLoCo(H=50)"
    seconds: float
    cross_bytes: float      # through each node's network link, per step (0 on one node)

    def share(self, compute_s: float) -> float:
        """The share of a step spent communicating, a step being ``compute_s`` plus this (no overlap)."""
        total = compute_s + self.seconds
        return self.seconds / total if total > 0 else 0.0


def _ring(n: int) -> float:
    """The (n-1)/n of a ring collective over ``n`` ranks (0 for one)."""
    return (n - 1) / n if n > 1 else 0.0


def _intra_s(setup: Setup, link: Link) -> float:
    """The per-layer collectives within one node's ranks (hybrid and DiLoCo's inner steps)."""
    if link.intra_gbps is None:
        return 0.0
    per_param = setup.gathers * setup.param_bytes + setup.grad_bytes
    return per_param * setup.params * _ring(setup.ranks_per_node) / (link.intra_gbps * 1e9)


def estimate(mode: str, setup: Setup, link: Link, *, h: int = DEFAULT_H, pg_bytes: int = 2) -> Estimate:
    """One step's communication under ``mode`` (one of :data:`MODES`); the formulas are the module's docstring.

    ``h`` and ``pg_bytes`` are DiLoCo's: inner steps per outer step, and bytes a pseudo-gradient element
    (4 fp32, 2 bf16, 1 int8)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
    if h < 1:
        raise ValueError(f"DiLoCo's H must be at least 1, not {h}")
    cross = link.cross_gbps * 1e9
    n, w, m = setup.nodes, setup.world, setup.params
    if mode == "full":
        per_param = setup.gathers * setup.param_bytes + setup.grad_bytes
        if n == 1:
            return Estimate(mode, mode, _intra_s(setup, link), 0.0)
        slowest = min(cross, link.intra_gbps * 1e9) if link.intra_gbps else cross
        moved = per_param * m * _ring(w)
        return Estimate(mode, mode, moved / slowest, moved)
    if mode == "replicate":
        moved = 2 * m * setup.grad_bytes * _ring(w)
        if n == 1:
            return Estimate(mode, mode, moved / (link.intra_gbps * 1e9) if link.intra_gbps else 0.0, 0.0)
        slowest = min(cross, link.intra_gbps * 1e9) if link.intra_gbps else cross
        return Estimate(mode, mode, moved / slowest, moved)
    if mode == "hybrid":
        moved = 2 * m * setup.grad_bytes * _ring(n)
        return Estimate(mode, mode, _intra_s(setup, link) + moved / cross, moved)
    moved = 2 * m * pg_bytes * _ring(n) / h
    return Estimate(mode, f"DiLoCo(H={h})", _intra_s(setup, link) + moved / cross, moved)


def estimate_all(setup: Setup, link: Link, *, h: int = DEFAULT_H, pg_bytes: int = 2) -> list[Estimate]:
    """full, hybrid and DiLoCo(H): what ``doctor --fabric`` shows for each experiment."""
    return [estimate(m, setup, link, h=h, pg_bytes=pg_bytes) for m in ("full", "hybrid", "diloco")]


def _seconds(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def advice(chosen: str, estimates: Sequence[Estimate], compute_s: float, *, how: dict[str, str] | None = None,
           basis: str = "") -> str | None:
    """One line when ``chosen`` would spend over half of a step communicating, naming a mode that would not
    (the first such in ``estimates``' order; where none would, the one that spends least); None otherwise.

    ``how`` says how to pick a mode (``{"hybrid": "--param sharding=hybrid"}``), ``basis`` where the figures
    came from; both go in the line."""
    mine = next((e for e in estimates if e.mode == chosen), None)
    if mine is None or mine.share(compute_s) <= HALF:
        return None
    others = [e for e in estimates if e.mode != chosen]
    if not others:
        return None
    better = next((e for e in others if e.share(compute_s) <= HALF), None)
    pick = better or min(others, key=lambda e: e.seconds)
    hint = (how or {}).get(pick.mode)
    line = (f"{mine.label} would spend ~{mine.share(compute_s):.0%} of a step communicating "
            f"({_seconds(mine.seconds)} against {_seconds(compute_s)} of compute")
    line += f"; {basis})" if basis else ")"
    verb = "would spend" if better else "every mode would spend over half; the least is"
    line += (f": {pick.label} {verb} ~{pick.share(compute_s):.0%}" if better else
             f": {verb} {pick.label}, ~{pick.share(compute_s):.0%}")
    return line + (f" ({hint})" if hint else "")

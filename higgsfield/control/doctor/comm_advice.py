"""The link decides, with the user's consent: an experiment's step priced on the measured fabric.

The cost model is :mod:`higgsfield.contract.comm_cost` (pure arithmetic); this module reads
what it needs from a project: an experiment's model size and tokens a step from its params,
the mode a run chose, and the link from a :class:`~higgsfield.contract.fabric.FabricResult`.
``doctor --fabric`` shows a row per experiment (:func:`experiment_rows`); ``run`` prints at most
one line (:func:`run_line`) and never waits on anything for it (the figure is the project's
cached last fabric test, :mod:`higgsfield.control.doctor.fabric_cache`).

Where an experiment's size comes from, first found (its ``@param`` defaults, or the run's values):

- a param ``model_size``, ``size`` or ``model`` whose value reads as a size (``7b``, ``125m``:
  :func:`~higgsfield.contract.comm_cost.model_size`; alpaca's ``size``);
- params ``hidden`` and ``layers``: ``12 x layers x hidden^2`` (a LLaMA layer's attention 4 h^2 and
  MLP 8 h^2; embeddings left out; tiny_llama);
- else none: ``doctor --fabric --model SIZE`` prices a size by hand.

The mode a run chose: ``diloco_every`` > 0 is DiLoCo (its H, ``diloco_quantize`` its bytes), else
``sharding`` (``auto`` as ``Llama`` resolves it). Tokens a step and rank: ``batch_size_per_gpu``
(or ``global_batch`` / ranks) times ``max_sequence_length`` (or ``seq_len``). Without both the
compute is unknown, and ``run`` says nothing rather than guess (``doctor --fabric`` still shows
the communication times).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from higgsfield.contract import comm_cost as cc
from higgsfield.contract.fabric import FabricResult
from higgsfield.contract.fabric_last import LastFabric

SIZE_PARAMS = ("model_size", "size", "model")
SEQ_PARAMS = ("max_sequence_length", "seq_len", "sequence_length")


@dataclass(frozen=True)
class Shape:
    """The params that price a step, read once from an experiment's values (the others are not looked at).

    A field is None where the experiment has no such param; ``precision`` and ``zero_stage`` default to
    ``Llama``'s own defaults."""

    model_size: Any = None
    size: Any = None
    model: Any = None
    hidden: Any = None
    layers: Any = None
    batch_size_per_gpu: Any = None
    global_batch: Any = None
    max_sequence_length: Any = None
    seq_len: Any = None
    sequence_length: Any = None
    precision: Any = "bf16"
    zero_stage: Any = 3
    sharding: Any = None
    activation_checkpointing: Any = False
    diloco_every: Any = None
    """DiLoCo's H (0: off), as tiny_llama names it (``Llama(diloco=DiLoCo(every=H))``)."""
    diloco_quantize: Any = None
    """DiLoCo's pseudo-gradients: ``none`` (fp32), ``bf16`` or ``int8``."""

    @property
    def diloco(self) -> tuple[int, int]:
        """(H, bytes a pseudo-gradient element): the run's when it says, else the defaults (50, bf16)."""
        h = self.diloco_every if _count(self.diloco_every) else cc.DEFAULT_H
        return h, {"none": 4, "fp32": 4, "bf16": 2, "int8": 1}.get(str(self.diloco_quantize), 2)

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Shape:
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


def params_of(shape: Shape) -> tuple[float, str] | None:
    """(parameter count, where it came from) read from an experiment's params, or None."""
    for name in SIZE_PARAMS:
        v = getattr(shape, name)
        if isinstance(v, str) and (n := cc.model_size(v)) is not None:
            return n, f"{name}={v}"
    hidden, layers = shape.hidden, shape.layers
    if isinstance(hidden, int) and isinstance(layers, int) and _count(hidden) and _count(layers):
        return 12.0 * layers * hidden * hidden, f"12 x layers x hidden^2 ({layers} x {hidden})"
    return None


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def tokens_per_rank(shape: Shape, world: int) -> float | None:
    """Tokens one rank processes a step, or None when the params do not say."""
    seq = next((getattr(shape, n) for n in SEQ_PARAMS if _count(getattr(shape, n))), None)
    per_gpu: float | None = shape.batch_size_per_gpu if _count(shape.batch_size_per_gpu) else None
    if per_gpu is None and _count(shape.global_batch):
        per_gpu = shape.global_batch / max(world, 1)
    if seq is None or not per_gpu:
        return None
    return float(per_gpu) * seq


def chosen_mode(shape: Shape) -> str:
    """The mode across nodes a run's params choose: ``sharding`` (``auto``: what ``zero_stage`` implies, as
    ``Llama`` resolves it), full when the experiment does not say."""
    if _count(shape.diloco_every):
        return "diloco"
    if shape.sharding in ("full", "hybrid", "replicate"):
        return str(shape.sharding)
    return "replicate" if shape.zero_stage == 0 else "full"


def setup_of(params: float, shape: Shape, nodes: int, ranks_per_node: int) -> cc.Setup:
    """The cost model's setup: the precision's bytes, ZeRO-2's one all-gather a step (3's two)."""
    param_bytes, grad_bytes = cc.BYTES.get(str(shape.precision), cc.BYTES["bf16"])
    gathers = 1 if shape.zero_stage == 2 else 2
    return cc.Setup(params=params, nodes=nodes, ranks_per_node=ranks_per_node, param_bytes=param_bytes,
                    grad_bytes=grad_bytes, gathers=gathers)


def link_of(result: FabricResult) -> cc.Link | None:
    """The link a fabric test measured: its all-reduce's peak busbw across the nodes, the slowest node's own
    (None when no node had several ranks); None when nothing was measured."""
    if result.peak_busbw_gbps <= 0:
        return None
    intra = [n.intra_busbw_gbps for n in result.per_node if n.intra_busbw_gbps]
    return cc.Link(cross_gbps=result.peak_busbw_gbps, intra_gbps=min(intra) if intra else None)


def gpu_of(result: FabricResult) -> str | None:
    """The first GPU's name the test saw (None: CPU nodes)."""
    return next((g.name for n in result.per_node for g in n.gpus or []), None)


def ranks_of(result: FabricResult) -> int:
    return max((n.ranks for n in result.per_node), default=1)


@dataclass(frozen=True)
class Row:
    """One experiment (or ``--model SIZE``) priced on the measured link: ``doctor --fabric``'s table."""

    experiment: str
    params: float
    source: str
    nodes: int
    ranks_per_node: int
    compute_s: float | None     # None: the tokens a step are not known
    estimates: list[cc.Estimate]


def row(name: str, size: tuple[float, str], shape: Shape, result: FabricResult, link: cc.Link, *,
        h: int = cc.DEFAULT_H) -> Row:
    """``name`` priced on the nodes and ranks ``result`` measured."""
    nodes, ranks = len(result.nodes), ranks_of(result)
    setup = setup_of(size[0], shape, nodes, ranks)
    tokens = tokens_per_rank(shape, nodes * ranks)
    compute = None if tokens is None else cc.compute_seconds(
        size[0], tokens, cc.achieved_flops(gpu_of(result)), activation_checkpointing=bool(shape.activation_checkpointing))
    return Row(name, size[0], size[1], nodes, ranks, compute, cc.estimate_all(setup, link, h=h))


def experiment_rows(experiments: Sequence[tuple[str, Mapping[str, Any]]], result: FabricResult, *,
                    model: float | None = None, h: int = cc.DEFAULT_H) -> tuple[list[Row], list[str]]:
    """Rows for the experiments whose size can be told (name, param defaults), and the names of those
    whose cannot; with ``model``, one row for that size alone."""
    link = link_of(result)
    if link is None:
        return [], []
    if model is not None:
        return [row(f"--model {cc.size_text(model)}", (model, "--model"), Shape(), result, link, h=h)], []
    rows, unknown = [], []
    for name, values in experiments:
        shape = Shape.of(values)
        size = params_of(shape)
        if size is None:
            unknown.append(name)
        else:
            rows.append(row(name, size, shape, result, link, h=h))
    return rows, unknown


def _ago(at: float | None, now: float) -> str:
    if at is None:
        return ""
    s = max(0.0, now - at)
    return f" {s / 60:.0f} min ago" if s < 5400 else f" {s / 3600:.0f} h ago" if s < 172800 else \
        f" {s / 86400:.0f} days ago"


def run_line(values: Mapping[str, Any], nodes: int, nproc: int | None, last: LastFabric | None, *,
             now: float | None = None) -> str | None:
    """The one line ``run`` prints when its mode would spend over half of a step communicating, naming a mode
    that would not; None when it would not, or when a figure it needs is unknown (one node, no fabric test
    kept, no size or tokens a step in the params)."""
    if nodes < 2 or last is None or last.result is None:
        return None
    result, shape = last.result, Shape.of(values)
    link, size = link_of(result), params_of(shape)
    ranks = nproc or ranks_of(result)
    tokens = tokens_per_rank(shape, nodes * ranks)
    if link is None or size is None or tokens is None:
        return None
    setup = setup_of(size[0], shape, nodes, ranks)
    compute = cc.compute_seconds(size[0], tokens, cc.achieved_flops(gpu_of(result)),
                                 activation_checkpointing=bool(shape.activation_checkpointing))
    mode = chosen_mode(shape)
    h, pg_bytes = shape.diloco
    estimates = cc.estimate_all(setup, link, h=h, pg_bytes=pg_bytes)
    if all(e.mode != mode for e in estimates):
        estimates.append(cc.estimate(mode, setup, link))
    how = {m: f"--param sharding={m}" for m in ("full", "hybrid", "replicate")} if shape.sharding is not None else {
        m: f"Llama(sharding='{m}')" for m in ("full", "hybrid", "replicate")}
    if shape.diloco_every is not None:
        how["diloco"] = f"--param diloco_every={h}"
    basis = (f"{cc.size_text(size[0])} params, {link.cross_gbps:.3g} GB/s busbw from doctor --fabric"
             f"{_ago(last.at, time.time() if now is None else now)}")
    line = cc.advice(mode, estimates, compute, how=how, basis=basis)
    return None if line is None else f"higgsfield: {line}"


def project_rows(cfg: Any, result: FabricResult, *, model: float | None = None,
                 h: int = cc.DEFAULT_H) -> tuple[list[Row], list[str], str]:
    """:func:`experiment_rows` for the experiments under the project's ``src/`` (their ``@param`` defaults),
    and a note when they cannot be read (the fabric figures stand without them)."""
    from higgsfield.contract.errors import ExperimentError
    from higgsfield.control.project.discovery import discover

    found: list[tuple[str, Mapping[str, Any]]] = []
    note = ""
    if model is None:
        try:
            found = [(e.name, {p.name: p.default for p in e.params}) for e in discover(cfg.project_dir / "src")]
        except ExperimentError as e:
            note = f"experiments not priced: {e}"
    rows, unknown = experiment_rows(found, result, model=model, h=h)
    return rows, unknown, note


def plan_line(cfg: Any, plan: Any) -> str | None:
    """:func:`run_line` for a planned run (SSH nodes or a Slurm job), on the project's last fabric test.

    Never raises: a hint that fails must not stop a run, so any error is no line."""
    from higgsfield.control.doctor import fabric_cache

    try:
        settings = getattr(plan, "settings", None)
        if settings is not None:   # a Slurm job: its nodes and GPUs a node
            nodes, nproc = int(settings.nodes), int(settings.gpus_per_node) or None
        else:
            nodes = len(plan.nodes)
            per_node = cfg.node_nproc(plan.nodes[0]) if plan.nodes else None
            nproc = per_node if isinstance(per_node, int) else None
        if nodes < 2:
            return None
        return run_line(plan.params, nodes, nproc, fabric_cache.load(cfg))
    except Exception:   # noqa: BLE001 (a hint, never a reason to refuse a run)
        return None

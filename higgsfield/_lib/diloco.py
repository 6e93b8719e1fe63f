"""DiLoCo across nodes: each node trains on its own, every ``every`` steps an outer step joins them (private).

Why: on an ordinary network (1-25 GbE) a sharded model's per-step collectives run at the
speed of the slowest link. ``sharding='hybrid'`` (:mod:`higgsfield._lib.mesh`) keeps the
per-layer ones on the node but still all-reduces every step's gradient across nodes.
DiLoCo (arXiv 2311.08105) sends nothing between nodes for ``every`` (H) steps: each node
trains its own replica, sharded over its own ranks by FSDP2 (the (nodes, ranks) mesh's
``shard`` dimension only), with its own inner optimizer. Then the nodes average their
*pseudo-gradients* (the global weights less the node's weights) and an outer optimizer,
SGD with Nesterov momentum, steps the global weights with that average; every node goes on
from the new global weights. Traffic across nodes drops about H-fold, and 4x more with
``quantize="int8"`` (INTELLECT-1, arXiv 2412.01152), at a small cost in loss.

Use::

    model = Llama(config, sharding="hybrid", diloco=DiLoCo(every=50, outer_lr=0.7, momentum=0.9,
                                                           quantize="int8"))
    optimizer = model.make_optimizer(torch.optim.AdamW, lr=3e-4)   # the inner optimizer
    ... the usual loop: model.step(optimizer) runs the outer step itself every 50 steps

Why an option of its own beside ``sharding``: ``sharding`` says over which ranks the model is
*sharded*; DiLoCo says how often the nodes *meet*. DiLoCo shards within each node (what
``hybrid`` does), so ``sharding`` must be ``hybrid`` or ``auto`` with it.

What is torchft's and what is ours: the algorithm is torchft's own :class:`torchft.local_sgd.DiLoCo`
(the global weights kept on the host, the pseudo-gradient, the outer optimizer step, the
restore on a failed commit, the fragments of streaming DiLoCo). It drives a torchft ``Manager``,
which needs torchft's Lighthouse (a quorum server) and a process group per replica group that it
reconfigures as replicas come and go: a fault-tolerance design whose replicas are separate jobs.
A higgsfield run is one torchrun job whose nodes are fixed (a lost node is handled by the run's
own recovery), so :class:`NodeManager` is hand-written: what DiLoCo asks of a Manager (quorum,
commit, all-reduce), over the mesh's ``replicate`` dimension, where rank j of each node holds
the same shard. The quantized all-reduce is ours too: torchft's (``torchft.collectives``)
is Triton kernels that need CUDA; ours (:mod:`higgsfield._lib.diloco_quant`) runs on gloo too.
Streaming DiLoCo (fragments synced at staggered steps) is not offered yet: our all-reduce is
synchronous, so staggering would spread the waits without overlapping them.

Checkpoints: each node's replica, its inner optimizer, the global weights, the outer optimizer's
momentum and the step within the outer loop are saved (:mod:`higgsfield._lib.diloco_state`), so a
run resumed between two outer steps goes on as if never stopped.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from higgsfield._lib import comm_meter
from higgsfield._lib.diloco_quant import QUANTIZE, average
from higgsfield.contract.errors import ExperimentError

__all__ = ["DiLoCo", "DiLoCoError", "NodeManager", "Runner", "check_with", "QUANTIZE"]


class DiLoCoError(ExperimentError, ValueError):
    """A DiLoCo option that cannot work (H < 1, an unknown quantization, one node): one line, exit 2."""


@dataclass(frozen=True)
class DiLoCo:
    """The outer loop: ``every`` inner steps (H) between outer steps; the outer SGD's ``outer_lr``,
    ``momentum`` (Nesterov unless ``nesterov=False``); ``quantize``: the pseudo-gradients sent as
    ``None`` (fp32), ``"bf16"`` or ``"int8"`` (a scale per 1,024 values)."""

    every: int = 50
    outer_lr: float = 0.7
    momentum: float = 0.9
    nesterov: bool = True
    quantize: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise DiLoCoError(f"DiLoCo: every (H, inner steps between outer steps) must be a whole number of at "
                              f"least 1, got {self.every!r}")
        if self.quantize not in QUANTIZE:
            raise DiLoCoError(f"DiLoCo: unknown quantize {self.quantize!r}: choose None (fp32), 'bf16' or 'int8'")
        if not self.outer_lr > 0:
            raise DiLoCoError(f"DiLoCo: outer_lr must be positive, got {self.outer_lr!r}")
        if not 0 <= self.momentum < 1:
            raise DiLoCoError(f"DiLoCo: momentum must be in [0, 1), got {self.momentum!r}")

    def describe(self, nodes: int, per_node: int) -> str:
        """The line rank 0 prints at startup."""
        mom = f"{'Nesterov ' if self.nesterov and self.momentum else ''}momentum {self.momentum:g}"
        return (f"DiLoCo across {nodes} nodes: FSDP within each node's {per_node} ranks, an outer step every "
                f"{self.every} steps (outer lr {self.outer_lr:g}, {mom}, {self.quantize or 'fp32'} pseudo-gradients)")


def check_with(diloco: DiLoCo | None, sharding: str, engine: str, zero_stage: int) -> str:
    """The sharding to plan with ``diloco`` (``hybrid``), or the same ``sharding`` without it. One line if not."""
    if diloco is None:
        return sharding
    if not isinstance(diloco, DiLoCo):
        raise DiLoCoError(f"diloco= takes a DiLoCo(every=..., ...) or None, got {type(diloco).__name__}")
    if engine != "fsdp":
        raise DiLoCoError("DiLoCo runs with engine='fsdp' (its inner steps are FSDP2 within each node)")
    if zero_stage not in (2, 3):
        raise DiLoCoError(f"DiLoCo shards each node's replica over its ranks: use zero_stage=2 or 3, not {zero_stage}")
    if sharding not in ("auto", "hybrid"):
        raise DiLoCoError(f"DiLoCo shards within each node and syncs nodes every {diloco.every} steps: "
                          f"use sharding='hybrid' (or 'auto') with it, not {sharding!r}")
    return "hybrid"


def check_nodes(diloco: DiLoCo, shape: tuple[int, ...]) -> None:
    """Refuse DiLoCo on one node (nothing to sync: plain FSDP is the same thing, cheaper)."""
    if len(shape) != 2 or shape[0] < 2:
        raise DiLoCoError(f"DiLoCo needs 2 nodes or more and this run has {shape[0] if len(shape) == 2 else 1}: "
                          "leave diloco out (one node trains as plain FSDP), or run on more nodes")


class _Done:
    """A finished collective, as torchft's DiLoCo waits on it (``wait``, ``get_future``)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor

    def wait(self, timeout: Any = None) -> bool:
        return True

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        fut: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        fut.set_result([self._tensor])
        return fut


class NodeManager:
    """What torchft's DiLoCo asks of its ``torchft.Manager``, for a fixed set of nodes (see the module docstring).

    ``group``: this rank and the ranks holding the same shard on the other nodes. Every commit succeeds:
    a node that fails fails the run (torchrun, the run's recovery), never one outer step.
    """

    _use_async_quorum = False

    def __init__(self, group: Any, quantize: str | None) -> None:
        self.group = group
        self.quantize = quantize
        self.step = 0
        self.state_fns: dict[str, Any] = {}

    def start_quorum(self, *args: Any, **kwargs: Any) -> None:
        pass

    def current_step(self) -> int:
        return self.step

    def should_commit(self, *args: Any, **kwargs: Any) -> bool:
        self.step += 1
        return True

    def allreduce(self, tensor: torch.Tensor, should_quantize: bool = False, **kwargs: Any) -> _Done:
        """Average ``tensor`` over the nodes in place; its bytes and time go to :mod:`comm_meter`."""
        began = time.perf_counter()
        sent = average(tensor, self.group, self.quantize if should_quantize else None)
        comm_meter.add(sent, time.perf_counter() - began)
        return _Done(tensor)

    def disallow_state_dict_read(self) -> None:
        pass

    def allow_state_dict_read(self) -> None:
        pass

    def register_state_dict_fn(self, key: str, load_fn: Any, save_fn: Any) -> None:
        self.state_fns[key] = (load_fn, save_fn)


class Runner:
    """torchft's DiLoCo on a :class:`higgsfield.llama.Llama`: its outer optimizer and :class:`NodeManager`.

    Made by ``Llama.make_optimizer``; its hooks on the inner optimizer run the outer step after every H-th
    ``optimizer.step()``.
    """

    def __init__(self, config: DiLoCo, module: torch.nn.Module, inner: torch.optim.Optimizer, node_mesh: Any) -> None:
        try:
            from torchft.local_sgd import DiLoCo as TorchftDiLoCo
        except ImportError as e:
            raise DiLoCoError(f"DiLoCo runs torchft's algorithm and torchft does not import here ({e}): "
                              "pip install torchft (its wheels are for Linux x86_64)") from None

        self.config = config
        self.module = module
        self.node = int(node_mesh["replicate"].get_local_rank())
        self.nodes = int(node_mesh.size(0))
        self.outer = torch.optim.SGD(module.parameters(), lr=config.outer_lr, momentum=config.momentum,
                                     nesterov=config.nesterov and config.momentum > 0)
        self.manager = NodeManager(node_mesh["replicate"].get_group(), config.quantize)
        self.algo = TorchftDiLoCo(self.manager, [module], inner, self.outer, sync_every=config.every,  # type: ignore[arg-type]
                                  pin_memory=False, should_quantize=config.quantize is not None)
        self.algo.__enter__()   # its hooks on the inner optimizer: counted steps, the outer step every H
        comm_meter.arm()

    @property
    def fragment(self) -> Any:
        return self.algo._fragments[0]

    @property
    def local_step(self) -> int:
        """Inner steps since the last outer step (0..H-1)."""
        return int(self.algo._local_step)

    def restore(self, local_step: int, manager_step: int) -> None:
        """After a checkpoint load: where the outer loop was (the weights are restored by the caller)."""
        self.algo._local_step = local_step
        self.manager.step = manager_step


def announce(config: DiLoCo, shape: tuple[int, ...]) -> None:
    if dist.get_rank() == 0:
        print(f"higgsfield: {config.describe(shape[0], shape[1])}", file=sys.stderr, flush=True)

"""Which ranks a ``Llama`` shards over: every rank, each node's ranks, or none (private).

FSDP2 all-gathers each layer's parameters in forward and backward and reduce-scatters
its gradients, over the ranks of its mesh's ``shard`` dimension: once per layer per pass.
Over every rank of every node (``full``) each of those collectives runs at the speed of the
slowest link, the network between nodes. ``hybrid`` (HSDP) shards within each node and
replicates across nodes, a 2-D mesh (nodes, ranks per node) named ("replicate", "shard"):
the per-layer collectives stay on the node's own links and one all-reduce of the gradient
shards per step crosses the network. Its price is memory: a rank holds 1/ranks-per-node of the
weights, gradients and optimizer state, not 1/world. ``replicate`` shards nothing (DDP).

``zero_stage`` says *what* is sharded (0: nothing, 2: gradients and optimizer state, 3: the
parameters too, between forward and backward); ``sharding`` says *over which ranks*. So
``zero_stage=0`` is ``replicate`` and only that, and ``full`` and ``hybrid`` need 2 or 3.

The default, ``auto``: replicate for ``zero_stage=0``; hybrid when the run spans more than
one node, each with more than one rank, and the training state sharded over one node's ranks
takes at most half of a rank's memory; full otherwise. The memory test is there because the
library offers a 70B: its fp32 weights, gradients and AdamW moments (16 bytes a parameter,
1.1 TB) over one 8-GPU node are 140 GB a GPU, which no H100 holds, while full sharding over 2
such nodes gives 70 GB: hybrid unconditionally would turn a run that fits into an
out-of-memory. A 7B (14 GB a GPU on one node) gets hybrid. DeepSpeed's ``auto`` is its own
default (full); its ``hybrid`` is ZeRO++ hpZ (:mod:`higgsfield._lib.deepspeed`).

Every rank must build the same mesh, so what the choice reads is agreed first (:func:`agree`:
an all-gather of each rank's node, ``LOCAL_WORLD_SIZE`` and memory). torchrun numbers ranks
node after node, and hybrid needs every node to hold the same number of consecutive ranks;
where they do not, ``auto`` falls back to full and says why, and ``hybrid`` is refused.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["SHARDINGS", "MeshPlan", "agree", "build", "check_sharding", "choose", "fits_node", "plan_mesh",
           "ranks_per_node"]

SHARDINGS = ("auto", "full", "hybrid", "replicate")


@dataclass(frozen=True)
class MeshPlan:
    """The mesh for a sharding: ``sharding`` resolved (never ``auto``), and why it was chosen."""

    sharding: str
    shape: tuple[int, ...]
    names: tuple[str, ...]
    why: str

    def describe(self, engine: str = "fsdp") -> str:
        """The line rank 0 prints at startup: ``FSDP mesh (2, 2) replicate x shard (hybrid: ...)``."""
        if engine == "deepspeed":
            what = {"hybrid": f"ZeRO++ hpZ, parameters gathered within each node's {self.shape[-1]} ranks",
                    "full": "ZeRO partitions over every rank", "replicate": "no ZeRO partitioning"}[self.sharding]
            return f"DeepSpeed {what} ({self.sharding}: {self.why})"
        return f"FSDP mesh {self.shape} {' x '.join(self.names)} ({self.sharding}: {self.why})"


def check_sharding(sharding: str, zero_stage: int, engine: str = "fsdp") -> None:
    """Refuse a sharding that cannot go with ``zero_stage``/``engine``, in one line (ValueError)."""
    if sharding not in SHARDINGS:
        raise ValueError(f"unknown sharding {sharding!r}: choose one of {', '.join(SHARDINGS)} "
                         "(hybrid = shard within each node, replicate across nodes)")
    if zero_stage == 0 and sharding in ("full", "hybrid"):
        raise ValueError(f"sharding={sharding!r} shards the model and zero_stage=0 shards nothing: use "
                         "zero_stage=2 or 3 with it, or sharding='replicate' (or 'auto')")
    if zero_stage != 0 and sharding == "replicate":
        raise ValueError(f"sharding='replicate' keeps everything whole on every rank, which is zero_stage=0: "
                         f"pass zero_stage=0 with it, or sharding='full' or 'hybrid' for zero_stage={zero_stage}")
    if engine == "deepspeed" and sharding == "hybrid" and zero_stage != 3:
        raise ValueError(f"sharding='hybrid' with engine='deepspeed' is ZeRO++ hpZ, which is ZeRO-3 only: use "
                         f"zero_stage=3 with it, or sharding='full' for zero_stage={zero_stage}")


def ranks_per_node(nodes: Sequence[str], local_sizes: Sequence[int]) -> tuple[int | None, str]:
    """(ranks on each node, "") when every node holds the same number of consecutive ranks, else (None, why).

    ``nodes[r]``: rank r's node (torchrun's GROUP_RANK, else the host); ``local_sizes[r]``: its LOCAL_WORLD_SIZE.
    """
    counts: dict[str, int] = {}
    for n in nodes:
        counts[n] = counts.get(n, 0) + 1
    if len(set(counts.values())) > 1 or len(set(local_sizes)) > 1:
        sizes = sorted(set(counts.values()) | set(local_sizes))
        return None, f"the nodes have different numbers of ranks ({', '.join(map(str, sizes))})"
    size = next(iter(counts.values()), 1)
    if local_sizes and local_sizes[0] != size:
        return None, f"LOCAL_WORLD_SIZE is {local_sizes[0]} but each node runs {size} ranks"
    blocks = [nodes[i] for i in range(0, len(nodes), size)]
    if len(set(blocks)) != len(blocks) or any(nodes[r] != blocks[r // size] for r in range(len(nodes))):
        return None, "the ranks are not numbered node after node"
    return size, ""


def fits_node(n_params: int, precision: str, ranks_per_node: int, memory_per_rank: int) -> bool:
    """Do the weights, gradients and AdamW moments, sharded over one node's ranks, take at most half a rank's
    memory? 16 bytes a parameter (fp32 masters), 8 for ``bf16_pure``; the other half is for activations."""
    state = n_params * (8 if precision == "bf16_pure" else 16)
    return state <= ranks_per_node * memory_per_rank // 2


def plan_mesh(sharding: str, world_size: int, local_world_size: int | None, zero_stage: int, *,
              engine: str = "fsdp", uneven: str = "", node_fits: bool = True) -> MeshPlan:
    """The mesh for ``sharding`` on ``world_size`` ranks, ``local_world_size`` a node (None: nodes differ,
    ``uneven`` says how). ``node_fits``: :func:`fits_node` (``auto`` shards over every rank when False)."""
    check_sharding(sharding, zero_stage, engine)
    ws = world_size
    if zero_stage == 0:
        return MeshPlan("replicate", (ws, 1), ("replicate", "shard"), "zero_stage=0")
    if sharding == "full" or (sharding == "auto" and engine == "deepspeed"):
        return MeshPlan("full", (ws,), ("shard",), "asked" if sharding == "full" else "DeepSpeed's default")
    if local_world_size is None or ws % local_world_size:
        why = uneven or f"{ws} ranks do not divide into nodes of {local_world_size}"
        if sharding == "hybrid":
            raise ValueError(f"sharding='hybrid' needs the same number of ranks on every node and {why}: "
                             "start as many on each, or use sharding='full'")
        return MeshPlan("full", (ws,), ("shard",), why)
    nodes = ws // local_world_size
    if sharding == "hybrid":
        return MeshPlan("hybrid", (nodes, local_world_size), ("replicate", "shard"),
                        f"asked, {nodes} nodes x {local_world_size} ranks")
    if nodes == 1:
        return MeshPlan("full", (ws,), ("shard",), "one node")
    if local_world_size == 1:
        return MeshPlan("full", (ws,), ("shard",), "one rank a node")
    if not node_fits:
        return MeshPlan("full", (ws,), ("shard",), f"the training state over one node's {local_world_size} "
                        "ranks would take over half a rank's memory")
    return MeshPlan("hybrid", (nodes, local_world_size), ("replicate", "shard"),
                    f"{nodes} nodes x {local_world_size} ranks")


def _memory_per_rank(dev: torch.device, cpu_offload: bool) -> int:
    """A rank's memory: its GPU's, or with ``cpu_offload`` / on CPU its share of the host's."""
    if dev.type == "cuda" and not cpu_offload:
        return int(torch.cuda.get_device_properties(dev).total_memory)
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return host // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def agree(dev: torch.device, cpu_offload: bool) -> tuple[int | None, str, int]:
    """(ranks per node or None, why not, the smallest memory of any rank), the same on every rank. Collective."""
    mine = (os.environ.get("GROUP_RANK") or socket.gethostname(), int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            _memory_per_rank(dev, cpu_offload))
    infos: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(infos, mine)
    size, why = ranks_per_node([i[0] for i in infos], [i[1] for i in infos])
    return size, why, min(i[2] for i in infos)


def choose(sharding: str, engine: str, zero_stage: int, precision: str, n_params: Callable[[], int],
           dev: torch.device, cpu_offload: bool) -> MeshPlan:
    """The plan for this run (every rank the same one); rank 0 prints it in one line. Collective."""
    size, uneven, memory = agree(dev, cpu_offload)
    fits = True
    if sharding == "auto" and engine == "fsdp" and size is not None and zero_stage != 0 \
            and 1 < size < dist.get_world_size():
        fits = fits_node(n_params(), precision, size, memory)
    plan = plan_mesh(sharding, dist.get_world_size(), size, zero_stage, engine=engine, uneven=uneven,
                     node_fits=fits)
    if dist.get_rank() == 0:
        print(f"higgsfield: {plan.describe(engine)}", file=sys.stderr, flush=True)
    return plan


def build(plan: MeshPlan, dev: torch.device) -> Any:
    """The torch DeviceMesh of ``plan`` (ranks row-major: node after node, as torchrun numbers them)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(dev.type, plan.shape, mesh_dim_names=plan.names)

"""Which ranks a ``Llama`` shards over: every rank, each node's ranks, or none (private).

FSDP2 all-gathers each layer's parameters in forward and backward and reduce-scatters
its gradients, over the ranks of its mesh's ``shard`` dimension: once per layer per pass.
Over every rank of every node (``full``) each of those collectives runs at the speed of the
slowest link, the network between nodes. ``hybrid`` (HSDP) shards within each node and
replicates across nodes, a 2-D mesh (nodes, ranks per node) named ("replicate", "shard"):
the per-layer collectives stay on the node's own links and one all-reduce of the gradient
shards per step crosses the network. Its price is memory: a rank holds 1/ranks-per-node of the
weights, gradients and optimizer state, not 1/world (a 70B's fp32 weights, gradients and AdamW
moments, 1.1 TB, are 140 GB a GPU over one 8-GPU node, more than an H100 holds, and 70 GB fully
sharded over 2 nodes). ``replicate`` shards nothing (DDP).

``zero_stage`` says *what* is sharded (0: nothing, 2: gradients and optimizer state, 3: the
parameters too, between forward and backward); ``sharding`` says *over which ranks*. So
``zero_stage=0`` is ``replicate`` and only that, and ``full`` and ``hybrid`` need 2 or 3.

The default, ``auto``, is what ``zero_stage`` implies: replicate for 0, full otherwise;
hybrid is asked for. What keeps it off the default is memory: ``auto`` cannot tell whether the
model fits one node's share (above), and a run that fits fully sharded must not fail for lack
of memory by default. (It was kept off for a hang too, now fixed: 2 nodes x 2 ranks under hybrid,
a worker killed with an asynchronous save in flight, and torchrun's restart hung in 7 of 11
tries, since a surviving rank could not exit while its save thread waited in a gloo collective.
Saves no longer hold a failing rank, :mod:`higgsfield._lib.ckpt_async`, and that run restarts.)
DeepSpeed's ``hybrid`` is ZeRO++ hpZ (:mod:`higgsfield._lib.deepspeed`).

Every rank must build the same mesh, so what the choice reads is agreed first (:func:`agree`:
an all-gather of each rank's node and ``LOCAL_WORLD_SIZE``). torchrun numbers ranks node after
node, and hybrid needs every node to hold the same number of consecutive ranks; where they do
not, ``hybrid`` is refused in one line.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["SHARDINGS", "MeshPlan", "agree", "build", "check_sharding", "choose", "plan_mesh", "ranks_per_node"]

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


def plan_mesh(sharding: str, world_size: int, local_world_size: int | None, zero_stage: int, *,
              engine: str = "fsdp", uneven: str = "") -> MeshPlan:
    """The mesh for ``sharding`` on ``world_size`` ranks, ``local_world_size`` a node (None: the nodes differ,
    ``uneven`` says how)."""
    check_sharding(sharding, zero_stage, engine)
    ws = world_size
    if zero_stage == 0:
        return MeshPlan("replicate", (ws, 1), ("replicate", "shard"), "zero_stage=0")
    if sharding in ("full", "auto"):
        return MeshPlan("full", (ws,), ("shard",), "asked" if sharding == "full" else "the default")
    if local_world_size is None or ws % local_world_size:
        why = uneven or f"{ws} ranks do not divide into nodes of {local_world_size}"
        raise ValueError(f"sharding='hybrid' needs the same number of ranks on every node and {why}: "
                         "start as many on each, or use sharding='full'")
    nodes = ws // local_world_size
    return MeshPlan("hybrid", (nodes, local_world_size), ("replicate", "shard"),
                    f"asked, {nodes} nodes x {local_world_size} ranks")


def agree() -> tuple[int | None, str]:
    """(ranks per node or None, why not), the same on every rank. Collective."""
    mine = (os.environ.get("GROUP_RANK") or socket.gethostname(), int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    infos: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(infos, mine)
    return ranks_per_node([i[0] for i in infos], [i[1] for i in infos])


def choose(sharding: str, engine: str, zero_stage: int) -> MeshPlan:
    """The plan for this run (every rank the same one); rank 0 prints it in one line. Collective."""
    size, uneven = agree()
    plan = plan_mesh(sharding, dist.get_world_size(), size, zero_stage, engine=engine, uneven=uneven)
    if dist.get_rank() == 0:
        print(f"higgsfield: {plan.describe(engine)}", file=sys.stderr, flush=True)
    return plan


def build(plan: MeshPlan, dev: torch.device) -> Any:
    """The torch DeviceMesh of ``plan`` (ranks row-major: node after node, as torchrun numbers them)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(dev.type, plan.shape, mesh_dim_names=plan.names)

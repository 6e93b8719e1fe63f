"""The model and optimizer shards of a checkpoint: DCP's files, node-local when nodes share no disk.

Used by :class:`higgsfield.checkpoint.Checkpoint` to write and read the weights of a
step (``.metadata``, ``__<rank>_0.distcp``; DeepSpeed's own format for
``engine='deepspeed'``). Its own module because the node-local variant of DCP (a
planner and a storage writer of our own) is one concept with its own reasons:

Why the metadata differs per node: DCP de-duplicates what every rank holds alike
(plain tensors such as AdamW's ``step``, and pickled values such as param groups)
to one rank's file, so a node holding only its own files would miss them. Here
each node's lead writes its own copy of those items (:func:`node_local_planner`),
and rank 0, which gathers every rank's write results, makes one ``.metadata`` per
node in which those items point at that node's copy (:func:`node_local_writer`);
the checkpoint sends each node's bytes to the node's lead. The sharded tensors
keep one global list of chunks (with the files named by global rank), so every
node's ``.metadata`` is a valid global one: the parts of all nodes put in one
directory (a mirror, a pull) load on any number of ranks. Writing per-node DCP
checkpoints on node subgroups would have been simpler, but their files collide by
name and no single metadata describes the whole model.

Under ``sharding='hybrid'`` (:mod:`higgsfield._lib.mesh`) every shard is held alike by one rank
of each node, so DCP writes it once: in a shared directory on whichever rank it balances to,
node-locally on node 0's rank, with :func:`copies_per_node` giving every other node its own
copy (each node's part is then the whole model and optimizer, in its own ranks' files). DCP
keeps each tensor's global shape, so such a step loads under any sharding on any ranks.

A DiLoCo run's nodes hold different replicas under the same names: its state is keyed by node
(:mod:`higgsfield._lib.diloco_state`).
"""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from higgsfield._lib import diloco_state
from higgsfield._lib.atomic_files import write_bytes
from higgsfield._lib.ckpt_agree import attempt
from higgsfield._lib.ckpt_async import save_in_background
from higgsfield._lib.ckpt_layout import Layout

__all__ = ["copies_per_node", "load_shards", "module", "node_local_planner", "node_local_writer", "save_shards",
           "spread_metadata"]


def module(model: Any) -> torch.nn.Module:
    """The sharded HF module inside a :class:`Llama` (or a plain FSDP2 module)."""
    return getattr(model, "module", model)


def save_shards(model: Any, optimizer: Any, path: Path, layout: Layout, async_group: Any = None) -> tuple[Any, Any]:
    """Write the shards into ``path``; returns (the future of an async save or None, the node-local writer or None).

    ``async_group``: a process group to save in the background on (None: save now), in a thread that never
    keeps a failing rank from exiting (:mod:`higgsfield._lib.ckpt_async`).
    """
    if getattr(model, "engine", "fsdp") == "deepspeed":
        engine = model.ds_engine
        if not layout.shared and layout.lead(dist.get_rank()):
            engine.save_non_zero_checkpoint = True  # its model-states file, which every rank's load reads
        engine.save_checkpoint(str(path), tag="deepspeed", save_latest=False)
        return None, None
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    with diloco_state.paused(model):
        msd, osd = get_state_dict(module(model), optimizer)
    state = diloco_state.wrap(model, {"model": msd, "optim": osd})   # DiLoCo: each node's own replica
    writer: Any = None
    kw: dict[str, Any] = {"checkpoint_id": str(path)}
    if not layout.shared:
        writer = node_local_writer(path, layout.node_of)
        kw = {"storage_writer": writer, "planner": node_local_planner(layout.node_of)}
    if async_group is None:
        dcp.save(state, **kw)
        return None, writer
    return save_in_background(state, async_group, **kw), writer


def load_shards(model: Any, optimizer: Any, path: Path, saved_world_size: int) -> None:
    """Read the shards of ``path`` into ``model`` and ``optimizer`` (any world size, but DeepSpeed's same one)."""
    if getattr(model, "engine", "fsdp") == "deepspeed":
        if saved_world_size != dist.get_world_size():
            raise ValueError(f"{path} was written by DeepSpeed on {saved_world_size} ranks and this run has "
                             f"{dist.get_world_size()}: convert it with `python -m "
                             "deepspeed.checkpoint.ds_to_universal` first, or use engine='fsdp'")
        model.ds_engine.load_checkpoint(str(path), tag="deepspeed", load_optimizer_states=True,
                                        load_lr_scheduler_states=False)
        return
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    with diloco_state.paused(model):
        msd, osd = get_state_dict(module(model), optimizer)
    state: dict[str, Any] = diloco_state.wrap(model, {"model": msd, "optim": osd})
    dcp.load(state, checkpoint_id=str(path))
    state = diloco_state.unwrap(model, state)
    with diloco_state.paused(model):
        set_state_dict(module(model), optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def spread_metadata(tmp: Path, layout: Layout, writer: Any) -> str | None:
    """Send each node's ``.metadata`` (made by rank 0's :func:`node_local_writer`) to that node's lead, which
    writes it into ``tmp``. Collective; returns this rank's failure (:func:`attempt`) for the ranks to agree on."""
    blobs: list[Any] = [writer.per_node if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(blobs, src=0)
    rank = dist.get_rank()
    node = layout.node_of[rank]

    def write() -> None:
        if layout.lead(rank) and node != layout.node_of[0]:
            write_bytes(blobs[0][node], tmp / ".metadata")

    return attempt(write, tmp)


def node_local_planner(node_of: tuple[int, ...]) -> Any:
    """A DefaultSavePlanner that also gives each node's lowest rank its node's copy of the replicated items."""
    from torch.distributed.checkpoint import DefaultSavePlanner

    class NodeLocalPlanner(DefaultSavePlanner):
        def _create_global_plan(self, all_plans: list[Any]) -> tuple[list[Any], Any]:
            global_plan, metadata = super()._create_global_plan(all_plans)
            return copies_per_node(all_plans, global_plan, node_of), metadata

    return NodeLocalPlanner(dedup_save_to_lowest_rank=True)


def copies_per_node(local: list[Any], deduped: list[Any], node_of: tuple[int, ...]) -> list[Any]:
    """Add back to ``deduped`` what a node would otherwise read from another node's file.

    DCP keeps each replicated item on one rank; here the lowest rank of every
    other node that planned the item writes it too. (A ``MetadataIndex`` compares
    by name and offset only, so these copies share the index of the one in the metadata.)
    """
    held = {item.index: node_of[r] for r, plan in enumerate(deduped) for item in plan.items}
    have: dict[int, set[Any]] = {}
    for index, node in held.items():
        have.setdefault(node, set()).add(index)
    extra: list[list[Any]] = [[] for _ in local]
    for r, plan in enumerate(local):
        mine = have.setdefault(node_of[r], set())
        for item in plan.items:
            if item.index not in mine:
                mine.add(item.index)
                extra[r].append(item)
    return [dataclasses.replace(plan, items=[*plan.items, *more]) for plan, more in zip(deduped, extra, strict=True)]


def node_local_writer(path: Path, node_of: tuple[int, ...]) -> Any:
    """A FileSystemWriter whose coordinator makes one ``.metadata`` per node (``per_node``: node -> bytes)."""
    from torch.distributed.checkpoint import FileSystemWriter

    class NodeLocalWriter(FileSystemWriter):
        per_node: dict[int, bytes]

        def finish(self, metadata: Any, results: list[list[Any]]) -> None:
            def mine_last(node: int) -> list[list[Any]]:  # a node's own copies listed last win
                ranks = sorted(range(len(results)), key=lambda r: node_of[r] == node)
                return [results[r] for r in ranks]

            super().finish(metadata, mine_last(node_of[0]))  # sets version and storage_meta in metadata
            self.per_node = {}
            for node in sorted(set(node_of) - {node_of[0]}):
                storage = {wr.index: wr.storage_data for wrs in mine_last(node) for wr in wrs}
                self.per_node[node] = pickle.dumps(dataclasses.replace(metadata, storage_data=storage))

    return NodeLocalWriter(str(path))

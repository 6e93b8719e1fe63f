"""What a checkpoint of a DiLoCo run holds beyond the model and optimizer, and why it is keyed by node (private).

Used by :mod:`higgsfield._lib.ckpt_shards` around DCP's save and load. Between two outer
steps every node's replica and inner optimizer (AdamW's moments) differ, though their
shards sit at the same offsets of the same parameters: under the usual keys DCP would take
them for one replicated tensor and keep one node's copy. So the whole state of a DiLoCo run
is put under ``diloco_node<k>``, each node's ranks writing and reading their own:

    diloco_node<k>/model, optim       this node's replica and its inner optimizer (DTensors, resharded
                                      by DCP onto another number of ranks per node)
    diloco_node<k>/diloco/global      the global weights the pseudo-gradient is taken against
    diloco_node<k>/diloco/outer       the outer optimizer (Nesterov momentum buffers)
    diloco_node<k>/diloco/loop        [inner steps since the last outer step, outer steps, nodes]

The global weights and outer state are alike on every node; each keeps its own copy, so a
node-local checkpoint (nodes that share no disk) holds all it needs. A resume onto another
number of nodes is refused in one line (which node's replica would a new node take?).

torch's ``get_state_dict`` of an optimizer with no state yet runs its ``step()`` once, with
zero gradients and a zero learning rate, to create it; torchft counts every inner ``step()``,
so its hooks are lifted while the state dicts are taken (:func:`paused`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["paused", "unwrap", "wrap"]


def _runner(model: Any) -> Any:
    return getattr(model, "diloco_runner", None)


@contextlib.contextmanager
def paused(model: Any) -> Iterator[None]:
    """torchft's hooks on the inner optimizer lifted for the block (nothing without DiLoCo)."""
    runner = _runner(model)
    if runner is None:
        yield
        return
    runner.algo.__exit__(None, None, None)
    try:
        yield
    finally:
        runner.algo.__enter__()


def wrap(model: Any, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` ({"model", "optim"}) as a DiLoCo run saves and loads it; ``state`` itself otherwise."""
    runner = _runner(model)
    if runner is None:
        return state
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    from torch.distributed.tensor import DTensor

    params = dict(runner.module.named_parameters())
    glob = {}
    for name, held in runner.fragment.original_parameters.items():
        p = params[name]
        glob[name] = DTensor.from_local(held.to(p.device), p.device_mesh, p.placements, shape=p.shape,
                                        stride=p.stride(), run_check=False)
    with paused(model):
        outer = get_optimizer_state_dict(runner.module, runner.outer)
    loop = torch.tensor([runner.local_step, runner.manager.step, runner.nodes], dtype=torch.int64)
    return {f"diloco_node{runner.node}": {**state, "diloco": {"global": glob, "outer": outer, "loop": loop}}}


def unwrap(model: Any, state: dict[str, Any]) -> dict[str, Any]:
    """After DCP loaded ``wrap``'s dict: restore the outer loop; returns the {"model", "optim"} part."""
    runner = _runner(model)
    if runner is None:
        return state
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    mine = dict(state[f"diloco_node{runner.node}"])
    extra = mine.pop("diloco")
    local_step, outer_steps, nodes = (int(x) for x in extra["loop"].tolist())
    if nodes != runner.nodes:
        raise ValueError(f"this DiLoCo checkpoint was written by {nodes} nodes and this run has {runner.nodes}: "
                         "resume it on as many nodes")
    for name, held in runner.fragment.original_parameters.items():
        held.copy_(extra["global"][name].to_local())
    with paused(model):
        set_optimizer_state_dict(runner.module, runner.outer, extra["outer"])
    runner.restore(local_step, outer_steps)
    return mine

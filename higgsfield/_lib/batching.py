"""The global batch kept on any number of ranks: how many micro-batches each rank accumulates per step.

Re-exported as :func:`higgsfield.training.accumulation`. Its own module because a run that
resumes on fewer or more ranks (a lost node, a spare, ``--min-nodes``) must keep its global
batch to keep its learning-rate schedule and loss curve, and that rule needs no torch.
"""

from __future__ import annotations

import os

__all__ = ["accumulation"]


def accumulation(global_batch: int, micro_batch: int, world_size: int | None = None) -> int:
    """Micro-batches each rank accumulates per optimizer step, so that every step sees ``global_batch`` samples.

    ``world_size x micro_batch x accumulation == global_batch``: a run that resumes on
    fewer or more ranks (a lost node, a spare, ``min_nodes``) keeps its global batch, and
    with it its learning rate schedule and loss curve. ``world_size``: ``params.world_size``
    (default: the process group's, else ``WORLD_SIZE``, else 1). Raises ValueError, naming
    the numbers, when they do not divide::

        accum = accumulation(params.global_batch, params.micro_batch, params.world_size)
        for micro in range(accum):
            loss = model(next(batches)) / accum
            loss.backward()
        optimizer.step()
    """
    if world_size is None:
        world_size = _world_size()
    per_pass = world_size * micro_batch
    if micro_batch < 1 or global_batch < per_pass or global_batch % per_pass:
        raise ValueError(f"global batch {global_batch} is not a multiple of {world_size} rank(s) x micro batch "
                         f"{micro_batch}: choose a global batch every world size you may run on divides (with "
                         f"spares or min_nodes, each possible number of ranks), or another micro batch")
    return global_batch // per_pass


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else \
        int(os.environ.get("WORLD_SIZE", "1"))

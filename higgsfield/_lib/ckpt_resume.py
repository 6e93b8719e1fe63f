"""Which checkpoint a run resumes from: its nodes' own parts, their buddy copies, or the mirror, in that order.

Used by :meth:`higgsfield.checkpoint.Checkpoint.load_latest`. Its own module because
the choice between the three sources (and the one line when none has a step) is one
concept apart from the save/load pair:

1. the newest step every node holds as its own loadable part (the ordinary resume);
2. a newer step the nodes can put together from their parts and buddy copies
   (:mod:`higgsfield._lib.ckpt_buddy`): a node lost its disk, a spare took its
   place, or the run goes on on fewer nodes or other ranks;
3. a newer step on the mirror (:mod:`higgsfield._lib.ckpt_from_mirror`), asked only
   when some node holds a step the others cannot match, or no node holds any.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from higgsfield._lib import ckpt_layout as layouts
from higgsfield._lib.ckpt_buddy import Buddies, restore
from higgsfield._lib.ckpt_from_mirror import fetch_newest
from higgsfield._lib.ckpt_layout import PREFIX, Layout, step_of
from higgsfield._lib.ckpt_mirror import Mirror
from higgsfield.contract.errors import CheckpointError

__all__ = ["resume_path"]


def resume_path(directory: Path, layout: Layout, complete: Callable[[], list[Path]], mirror: Mirror | None,
                buddies: Buddies) -> Path | None:
    """The local directory of the step to load (None: a fresh run). Collective; raises the same
    :class:`CheckpointError` on every rank when the nodes hold steps but none whole."""
    per_node, foreign = layouts.agreed_steps(layout, complete)
    usable = {n: steps - foreign[n] for n, steps in per_node.items()}
    everywhere = set.intersection(*usable.values()) if usable else set()
    best: int | None = max(everywhere, default=None)
    restored = restore(buddies, layout, complete, best)
    if restored is not None:
        best = step_of(restored)
    newest_here = max(set.union(*usable.values()), default=None) if usable else None
    if mirror is not None and (best is None or (newest_here is not None and newest_here > best)):
        found = fetch_newest(mirror, directory, layout, usable, best)   # newer there, or none here
        if found is not None:
            return found
    if restored is not None:
        return restored
    newest = max(set.union(*per_node.values()), default=None) if per_node else None
    if everywhere:
        step = max(everywhere)
        if newest is not None and newest > step and dist.get_rank() == 0:
            print(f"higgsfield: {layouts.missing(newest, per_node, layout)}; resuming from "
                  f"{PREFIX}{step:08d}, the newest checkpoint complete on every node", file=sys.stderr, flush=True)
        return directory / f"{PREFIX}{step:08d}"
    if newest is None:
        return None
    where = f"; the mirror {mirror.root} holds no complete step" if mirror is not None else \
        ": no node holds a buddy copy of the missing part, and no mirror is set (checkpoint.mirror)"
    raise CheckpointError(f"{layouts.missing(newest, per_node, layout)}{where}", {})

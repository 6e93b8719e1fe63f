"""Resuming from the checkpoint mirror: which step, which parts to fetch, and the download, agreed by every rank.

Used by :meth:`higgsfield.checkpoint.Checkpoint.load_latest` when no step is
complete on every node or the mirror holds a newer one. Its own module because it
is the collective side of the mirror (rank 0 asks it, every rank learns the
answer, each node's lead downloads what its node lacks), where
:mod:`higgsfield._lib.ckpt_mirror` is the mirror itself (fsspec, no torch).
After :func:`fetch_newest` the step is an ordinary complete one in the local
directory, so the load that follows is the normal one.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from higgsfield._lib.atomic_files import fsync_dir
from higgsfield._lib.ckpt_agree import agree, attempt
from higgsfield._lib.ckpt_layout import PREFIX, TMP, Layout
from higgsfield._lib.ckpt_mirror import Mirror, new_token, parts_to_fetch
from higgsfield.contract.errors import CheckpointError

__all__ = ["fetch_newest", "mirror_token"]


def mirror_token(mirror: Mirror | None) -> str | None:
    """One random word per save, the same on every rank: a mirror never mixes parts of two saves. Collective."""
    if mirror is None:
        return None
    token = [new_token() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(token, src=0)
    return token[0]


def fetch_newest(mirror: Mirror, directory: Path, layout: Layout, per_node: dict[int, set[int]],
                 newer_than: int | None) -> Path | None:
    """Bring the mirror's newest complete step into ``directory`` if it is newer than ``newer_than``; its
    local path, or None if the mirror holds none newer. Collective.

    ``per_node``: node -> the steps complete there that can load here. Rank 0 reads
    the mirror; each node's lead downloads what its node lacks (its own part on the
    same topology, every part otherwise, since each part's metadata is a valid
    global one), and the ranks agree (a failure raises CheckpointError on every rank).
    """
    rank = dist.get_rank()
    box: list[Any] = [None]
    if rank == 0:
        try:
            box[0] = ("ok", mirror.newest())
        except Exception as e:  # noqa: BLE001 - said on every rank as one line
            box[0] = ("error", f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
    dist.broadcast_object_list(box, src=0)
    kind, found = box[0]
    if kind == "error":
        raise CheckpointError(f"cannot read the checkpoint mirror {mirror.root}: {found}", {})
    if found is None or (newer_than is not None and found[0] <= newer_than):
        return None
    step, marker = found
    final = directory / f"{PREFIX}{step:08d}"
    node = layout.node_of[rank]
    parts = parts_to_fetch(marker, layout.shared, dist.get_world_size(),
                           [layout.ranks(n) for n in range(len(layout.names))], node)

    def fetch() -> None:
        if parts == [0 if layout.shared else node] and step in per_node.get(node, set()):
            return  # this node's own part is here and complete
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f"{TMP}mirror-{final.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        mirror.download(step, marker, parts, tmp)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_dir(directory)

    agree(f"download of {final.name} from the mirror {mirror.root}", attempt(fetch) if layout.lead(rank) else None,
          directory)
    if rank == 0:
        print(f"higgsfield: resuming from {final.name} on the checkpoint mirror {mirror.root}", file=sys.stderr,
              flush=True)
    return final

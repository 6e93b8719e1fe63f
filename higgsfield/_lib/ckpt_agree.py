"""A failed checkpoint save or load raises on every rank at the same point, never on one rank alone.

Used by :class:`higgsfield.checkpoint.Checkpoint` at the end of each phase of a save
(and before a load): every rank runs its part with :func:`attempt`, which turns a
failure into one line naming the rank, and :func:`agree` gathers those lines so
that all ranks raise the same :class:`CheckpointError`, or none does. Without this
a rank that cannot write would raise alone while the others wait for it in the
next collective until the process group times out. Its own module because that
protocol (and saying "the disk is full" where torch does not) is one concept.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from higgsfield.contract.errors import CheckpointError

__all__ = ["agree", "attempt", "full_disk", "local_rank"]

#: Below this much free space (or 0.5% of the filesystem) a failed write is reported as a full disk.
FULL_BELOW = 1 << 20


def attempt(fn: Callable[[], Any], where: Path | None = None) -> str | None:
    """Run ``fn``; None if it worked, else ``"rank R: Type: message"`` naming the rank where it failed.

    DCP already agrees across ranks and raises its CheckpointException everywhere;
    its first failure (a rank and an exception) is what is reported then. When the
    filesystem of ``where`` is (nearly) full that is said too: torch's own message
    for a full disk is "[enforce fail at inline_container.cc] unexpected pos".
    """
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        fn()
    except CheckpointException as e:
        if e.failures:
            origin = min(e.failures)
            exc = e.failures[origin][0]
            return f"rank {origin}: {type(exc).__name__}: {exc}{full_disk(where)}"
        return f"rank {dist.get_rank()}: {e}{full_disk(where)}"
    except Exception as e:  # noqa: BLE001 - every failure is reported to every rank, then raised
        return f"rank {dist.get_rank()}: {type(e).__name__}: {e}{full_disk(where)}"
    return None


def full_disk(where: Path | None) -> str:
    """`` (the filesystem of X is full: N KiB free)`` when it is, else ``""``."""
    if where is None:
        return ""
    for p in (where, *where.parents):
        try:
            st = os.statvfs(p)
        except OSError:
            continue
        free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
        if free < max(FULL_BELOW, total // 200):
            return f" (the filesystem of {p} is full: {free // 1024} KiB free of {total // 1024} KiB)"
        return ""
    return ""


def agree(what: str, error: str | None, directory: Path, partial: Path | None = None,
          latest: Callable[[], Path | None] | None = None) -> None:
    """Every rank learns whether any rank failed; if one did, all raise the same CheckpointError. Collective.

    ``error``: this rank's :func:`attempt`. ``partial`` (a save's temporary directory) is
    removed on failure, and the message then names ``latest()``, the checkpoint kept.
    """
    reports: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(reports, error)
    failures = {r: msg for r, msg in enumerate(reports) if msg}
    if not failures:
        return
    kept = ""
    if partial is not None:
        if local_rank() == 0:  # one rank per node: the directory may be local to each node
            shutil.rmtree(partial, ignore_errors=True)
        dist.barrier()  # nobody starts another save while the partial one is being removed
        last = latest() if latest is not None else None
        kept = f"; the last complete checkpoint, {last.name}, is intact" if last else \
            "; there is no earlier complete checkpoint"
    raise CheckpointError(f"checkpoint {what} in {directory} failed: {failures[min(failures)]}{kept}", failures)


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", dist.get_rank()))

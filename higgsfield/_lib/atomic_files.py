"""Files a crash never leaves half-written: write aside, fsync, rename (or swap) into place.

Used by :class:`higgsfield.checkpoint.Checkpoint` for its small files (``trainer.pt``,
``rng_rank<r>.pt``, a node's ``.metadata``) and for putting a finished step
directory in place. Its own module because "a reader sees the old whole or the
new whole, never a mix" is one concept with its own system calls
(``renameat2(RENAME_EXCHANGE)``, a directory's fsync), apart from what a checkpoint holds.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

__all__ = ["exchange", "fsync_dir", "replace_dir", "write_bytes", "write_small"]


def write_bytes(data: bytes, path: Path) -> None:
    """Write through a temporary name, fsync, rename: a reader never sees half a file."""
    part = path.with_name(path.name + ".part")
    with open(part, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(part, path)


def write_small(obj: Any, path: Path) -> None:
    """torch.save through memory, then one plain write and fsync.

    torch.save straight to a file on a full disk fails with "[enforce fail at
    inline_container.cc] unexpected pos"; a plain write says "No space left on device".
    """
    buf = io.BytesIO()
    torch.save(obj, buf)
    with open(path, "wb") as f:
        f.write(buf.getbuffer())
        f.flush()
        os.fsync(f.fileno())


def replace_dir(new: Path, final: Path, aside: Path) -> None:
    """Rename the directory ``new`` to ``final``, replacing one there (a re-save of the same step).

    Swapped in one step where the system can (:func:`exchange`); elsewhere the old
    one goes to ``aside`` only until the new one is in place, and comes back if that fails.
    """
    if final.exists() and exchange(new, final):
        fsync_dir(final.parent)
        shutil.rmtree(new, ignore_errors=True)
        return
    moved = False
    if final.exists():
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(final, aside)
        moved = True
    try:
        os.rename(new, final)
    except OSError:
        if moved:
            os.rename(aside, final)
        raise
    fsync_dir(final.parent)
    if moved:
        shutil.rmtree(aside, ignore_errors=True)


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return bool(renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0)


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (best effort: a directory that cannot be opened is left)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

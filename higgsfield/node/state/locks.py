"""One exclusive ``flock`` helper for the node side's read-modify-write sections.

The queue, a run's start and a project environment's build each serialise on a
lock file of their own; they share this one way of taking it, so the file's
mode (0600, under a 0700 directory: nodes keep their state private) and its
release on every path (the fd closes, the lock goes) are written once.

Use::

    with exclusive(state_dir / "queue.lock"):
        ...  # read, change, write
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` of ``lock_file`` (created 0600, its directory 0700) for the block."""
    lock_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)

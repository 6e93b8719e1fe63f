"""One exclusive file lock for the node side's read-modify-write sections (filelock).

The queue, a run's start and a project environment's build each serialise on a
lock file of their own; they share this one way of taking it, so the file's
mode (0600, under a 0700 directory: nodes keep their state private) and its
release on every path are written once. The lock is ``filelock``'s, pinned to
plain ``flock`` on a file that stays in place (no soft-lock fallback, no unlink
on release), which is what an invoker of an earlier release takes on the same
file while nodes upgrade with runs in flight.

Use::

    with exclusive(home.queue_lock):
        ...  # read, change, write
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock


@contextlib.contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` of ``lock_file`` (created 0600, its directory 0700) for the block."""
    lock_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with FileLock(lock_file, mode=0o600, thread_local=False, preserve_lock_file=True, fallback_to_soft=False):
        yield

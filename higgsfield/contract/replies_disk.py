"""The replies of the invoker's disk verbs: ``files`` (pull), ``prune`` and ``usage`` (doctor).

Typed and versioned as every reply (:mod:`higgsfield.contract.replies`, which has the
rules); their entries (a file, a run removed, a filesystem's free space) are typed too,
each checked where it sits (``'files[3].sha256' 'x' is not a sha256``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from higgsfield.contract.codec import rule
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.replies import Reply, Typed, not_negative
from higgsfield.contract.text import shown

SHA256_RE = re.compile(r"[0-9a-f]{64}")


def _sha256(v: str) -> None:
    if not SHA256_RE.fullmatch(v):
        raise ValueError(f"{shown(v)} is not a sha256")


# -- files (pull) ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FileEntry(Typed):
    """One file a node lists for a pull: its path under the reply's ``root``, size and sha256."""

    WHAT: ClassVar[str] = "file entry"

    path: str
    size: int = field(metadata=rule(check=not_negative))
    sha256: str = field(metadata=rule(check=_sha256))


def _marker(v: object) -> dict[str, Any] | None:
    return v if isinstance(v, dict) else None   # a marker that is no object: the pull writes its own


@dataclass(frozen=True)
class FilesReply(Reply):
    """``invoker files``: a run's complete checkpoint ``steps`` under ``root``; with ``--step`` also the step's
    ``files`` and its ``marker`` (left out otherwise: a marker goes with a step's files); with ``--logs`` the
    run directory's ``files``."""

    WHAT: ClassVar[str] = "files reply"
    SPARSE: ClassVar[frozenset[str]] = frozenset({"steps", "files", "marker"})

    root: str
    steps: list[str] | None = None
    files: list[FileEntry] | None = None
    marker: dict[str, Any] | None = field(default=None, metadata=rule(decode=_marker))
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


# -- prune ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PrunedRun(Typed):
    WHAT: ClassVar[str] = "run entry"

    run: str
    experiment: str = ""
    state: str = ""
    ended_at: float | None = None
    path: str = ""
    bytes: int = field(default=0, metadata=rule(check=not_negative))


@dataclass(frozen=True)
class PrunedCheckpoint(Typed):
    WHAT: ClassVar[str] = "checkpoint entry"

    run: str
    path: str
    bytes: int = field(default=0, metadata=rule(check=not_negative))


@dataclass(frozen=True)
class PrunedImage(Typed):
    WHAT: ClassVar[str] = "image entry"

    tag: str
    id: str = ""
    bytes: int = field(default=0, metadata=rule(check=not_negative))


@dataclass(frozen=True)
class Kept(Typed):
    """A run or an image the prune left, and why (active, in use, a removal that failed)."""

    WHAT: ClassVar[str] = "kept entry"
    SPARSE: ClassVar[frozenset[str]] = frozenset({"run", "image"})

    why: str
    run: str | None = None
    image: str | None = None

    def check(self) -> None:
        super().check()
        if (self.run is None) == (self.image is None):
            raise DecodeError("a kept entry names a run or an image")


@dataclass(frozen=True)
class PruneReply(Reply):
    """``invoker prune``: what went (or would go, ``dry_run``), what stayed and why, and the bytes freed."""

    WHAT: ClassVar[str] = "prune reply"

    runs: list[PrunedRun]
    freed_bytes: int = field(metadata=rule(check=not_negative))
    dry_run: bool = False
    checkpoints: list[PrunedCheckpoint] = field(default_factory=list)
    images: list[PrunedImage] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


# -- usage (doctor) ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class FreeSpace(Typed):
    """One filesystem the state dir or the checkpoints are on (``what``), and its free and total bytes."""

    WHAT: ClassVar[str] = "free-space entry"

    free_bytes: int = field(metadata=rule(check=not_negative))
    path: str
    total_bytes: int = field(metadata=rule(check=not_negative))
    what: str = ""


@dataclass(frozen=True)
class UsageReply(Reply):
    """``invoker usage``: the bytes of the state dir and of the project's checkpoints, and the free space of
    each filesystem they are on."""

    WHAT: ClassVar[str] = "usage reply"
    SPARSE: ClassVar[frozenset[str]] = frozenset({"state_dir"})

    state_bytes: int = field(metadata=rule(check=not_negative))
    free: list[FreeSpace]
    state_dir: str | None = None
    checkpoint_bytes: int = field(default=0, metadata=rule(check=not_negative))
    checkpoint_dirs: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

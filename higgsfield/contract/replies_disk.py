"""The replies of the invoker's disk verbs: ``files`` (pull), ``prune`` and ``usage`` (doctor).

Typed and versioned as every reply (:mod:`higgsfield.contract.replies`, which has the
rules); their entries (a file, a run removed, a filesystem's free space) are typed too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from higgsfield.contract.decode import DecodeError
from higgsfield.contract.replies import Reply, Typed, each, nonnegative
from higgsfield.contract.text import shown

SHA256_RE = re.compile(r"[0-9a-f]{64}")


# -- files (pull) ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FileEntry(Typed):
    """One file a node lists for a pull: its path under the reply's ``root``, size and sha256."""

    WHAT: ClassVar[str] = "file entry"

    path: str
    size: int
    sha256: str

    def check(self) -> None:
        nonnegative(self, "size")
        if not SHA256_RE.fullmatch(self.sha256):
            raise DecodeError(f"'sha256' {shown(self.sha256)} is not a sha256")


@dataclass(frozen=True)
class FilesReply(Reply):
    """``invoker files``: a run's complete checkpoint ``steps`` under ``root``; with ``--step`` also the step's
    ``files`` and its ``marker``; with ``--logs`` the run directory's ``files``."""

    WHAT: ClassVar[str] = "files reply"
    SPARSE: ClassVar[frozenset[str]] = frozenset({"steps", "files"})

    root: str
    steps: list[str] | None = None
    files: list[FileEntry] | None = None
    marker: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def decoders(cls) -> Mapping[str, Callable[[object], Any]]:
        return {"files": each(FileEntry, "file entry"), "marker": _marker}

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        if self.files is None or self.steps is None:   # a marker goes with a step's files (null: not JSON)
            d.pop("marker", None)
        return d


def _marker(v: object) -> dict[str, Any] | None:
    return v if isinstance(v, dict) else None   # a marker that is no object: the pull writes its own


# -- prune ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PrunedRun(Typed):
    WHAT: ClassVar[str] = "run entry"

    run: str
    experiment: str = ""
    state: str = ""
    ended_at: float | None = None
    path: str = ""
    bytes: int = 0

    def check(self) -> None:
        nonnegative(self, "bytes")


@dataclass(frozen=True)
class PrunedCheckpoint(Typed):
    WHAT: ClassVar[str] = "checkpoint entry"

    run: str
    path: str
    bytes: int = 0

    def check(self) -> None:
        nonnegative(self, "bytes")


@dataclass(frozen=True)
class PrunedImage(Typed):
    WHAT: ClassVar[str] = "image entry"

    tag: str
    id: str = ""
    bytes: int = 0

    def check(self) -> None:
        nonnegative(self, "bytes")


@dataclass(frozen=True)
class Kept(Typed):
    """A run or an image the prune left, and why (active, in use, a removal that failed)."""

    WHAT: ClassVar[str] = "kept entry"
    SPARSE: ClassVar[frozenset[str]] = frozenset({"run", "image"})

    why: str
    run: str | None = None
    image: str | None = None

    def check(self) -> None:
        if (self.run is None) == (self.image is None):
            raise DecodeError("a kept entry names a run or an image")


@dataclass(frozen=True)
class PruneReply(Reply):
    """``invoker prune``: what went (or would go, ``dry_run``), what stayed and why, and the bytes freed."""

    WHAT: ClassVar[str] = "prune reply"

    runs: list[PrunedRun]
    freed_bytes: int
    dry_run: bool = False
    checkpoints: list[PrunedCheckpoint] = field(default_factory=list)
    images: list[PrunedImage] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def decoders(cls) -> Mapping[str, Callable[[object], Any]]:
        return {"runs": each(PrunedRun, "run entry"), "checkpoints": each(PrunedCheckpoint, "checkpoint entry"),
                "images": each(PrunedImage, "image entry"), "kept": each(Kept, "kept entry")}

    def check(self) -> None:
        nonnegative(self, "freed_bytes")


# -- usage (doctor) ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class FreeSpace(Typed):
    """One filesystem the state dir or the checkpoints are on (``what``), and its free and total bytes."""

    WHAT: ClassVar[str] = "free-space entry"

    free_bytes: int
    path: str
    total_bytes: int
    what: str = ""

    def check(self) -> None:
        nonnegative(self, "free_bytes", "total_bytes")


@dataclass(frozen=True)
class UsageReply(Reply):
    """``invoker usage``: the bytes of the state dir and of the project's checkpoints, and the free space of
    each filesystem they are on."""

    WHAT: ClassVar[str] = "usage reply"
    SPARSE: ClassVar[frozenset[str]] = frozenset({"state_dir"})

    state_bytes: int
    free: list[FreeSpace]
    state_dir: str | None = None
    checkpoint_bytes: int = 0
    checkpoint_dirs: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def decoders(cls) -> Mapping[str, Callable[[object], Any]]:
        return {"free": each(FreeSpace, "free-space entry")}

    def check(self) -> None:
        nonnegative(self, "state_bytes", "checkpoint_bytes")

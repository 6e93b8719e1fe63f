"""Data entries (``data:`` in higgsfield.yml): their manifests and every message of ``data push``.

An entry is content-addressed: its :class:`Manifest` lists each file's path, size and sha256,
and its *version* is the sha256 of that list (:meth:`Manifest.version`), so equal bytes give
equal versions on every machine and an unchanged entry is recognised without sending a byte.

On a node (:mod:`higgsfield.node.data.store`), every file is kept once, by its sha256, in the
project's object store; a version is a tree of hard links to those objects, built in a staging
directory and renamed into place, and the entry's ``current`` link swapped to it (atomically), so
a run sees the old version or the whole new one. The laptop asks what is missing
(:class:`MissingReply`), sends objects as :func:`object_header` lines followed by their bytes,
and commits (:class:`CommitRequest`). Nodes copy objects among themselves over the same framing
after a mutual HMAC handshake (the gang wire's :class:`~higgsfield.contract.gang.Challenge`,
``Hello`` and ``Welcome``; :class:`ServeRequest` and :class:`FetchRequest` carry the transfer's
token on SSH stdin, never a command line).

Use::

    m = decode(Manifest, json.loads(raw)); m.version()
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import ClassVar

from higgsfield.contract.codec import rule
from higgsfield.contract.errors import HiggsfieldError
from higgsfield.contract.layout import STATE_OWN
from higgsfield.contract.replies import Reply, Typed, not_negative
from higgsfield.contract.replies_disk import SHA256_RE
from higgsfield.contract.text import shown

#: An entry's name: it becomes a directory on the nodes and ``HIGGSFIELD_DATA_<NAME>``.
DATA_NAME_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
#: The environment variable of one entry's path: ``HIGGSFIELD_DATA_<NAME upper>``; ``HIGGSFIELD_DATA``: all, as JSON.
DATA_VAR = "HIGGSFIELD_DATA"
VERSION_LEN = 24   # hex characters of a version shown and used as a directory name


class DataError(HiggsfieldError):
    """A data entry cannot be pushed or used as asked: a missing path, a file that changed, no space (exit 2)."""

    exit_code = 2


def data_var(name: str) -> str:
    """``HIGGSFIELD_DATA_<NAME>``: the variable that holds entry ``name``'s path in a run."""
    return f"{DATA_VAR}_{name.upper()}"


def check_data_name(v: str) -> None:
    if not DATA_NAME_RE.fullmatch(v):
        raise ValueError(f"{shown(v)} is not a data entry name: use letters, digits and _, not starting "
                         "with a digit (at most 64)")


def _sha256(v: str) -> None:
    if not SHA256_RE.fullmatch(v):
        raise ValueError(f"{shown(v)} is not a sha256")


def check_rel_path(v: str) -> None:
    """A file's path inside an entry: relative, POSIX, no ``..``, no empty or ``.`` part."""
    p = PurePosixPath(v)
    if (not v or v.startswith("/") or "\\" in v or "\0" in v or p.as_posix() != v
            or any(part in ("", ".", "..") for part in p.parts)):
        raise ValueError(f"{shown(v)} is not a relative path inside the entry")


def check_data_dest(v: str) -> None:
    """An entry's ``dest:``: a relative path inside the node's state directory, not one of higgsfield's own
    directories there (ValueError saying so: the one line a user sees)."""
    p = PurePosixPath(v)
    if (not v or v.startswith(("/", "~")) or "\\" in v or "\0" in v
            or any(part in ("", ".", "..") for part in v.split("/"))):
        raise ValueError(f"dest {shown(v)} is outside the node's state directory: give a path relative to it, "
                         "without '..' (dest: weights/base)")
    if p.parts[0] in STATE_OWN:
        raise ValueError(f"dest {shown(v)} is inside higgsfield's own '{p.parts[0]}' directory on the node: "
                         "choose another name (dest: weights/base)")


def _version(v: str) -> None:
    if not re.fullmatch(rf"[0-9a-f]{{{VERSION_LEN}}}", v):
        raise ValueError(f"{shown(v)} is not a data version")


@dataclass(frozen=True)
class DataFile(Typed):
    """One file of an entry."""

    WHAT: ClassVar[str] = "data file"

    path: str = field(metadata=rule(check=check_rel_path))
    size: int = field(metadata=rule(check=not_negative))
    sha256: str = field(metadata=rule(check=_sha256))


@dataclass(frozen=True)
class Manifest(Typed):
    """Every file of one version of an entry, sorted by path."""

    WHAT: ClassVar[str] = "data manifest"

    files: list[DataFile] = field(default_factory=list)

    def check(self) -> None:
        super().check()
        paths = [f.path for f in self.files]
        if paths != sorted(paths) or len(set(paths)) != len(paths):
            raise ValueError("'files' must be sorted by path, each path once")
        dirs = {str(p) for f in self.files for p in PurePosixPath(f.path).parents}
        clash = next((p for p in paths if p in dirs), None)
        if clash is not None:
            raise ValueError(f"'files': {shown(clash)} is both a file and a directory")

    def version(self) -> str:
        """The sha256 of the path, size and sha256 of every file (its first hex characters)."""
        h = hashlib.sha256()
        for f in self.files:
            h.update(f"{f.path}\0{f.size}\0{f.sha256}\n".encode())
        return h.hexdigest()[:VERSION_LEN]

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


# -- node replies ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EntryState(Typed):
    """One entry on a node: its current version (None: none yet), every version kept, their bytes."""

    WHAT: ClassVar[str] = "data entry"

    name: str = field(metadata=rule(check=check_data_name))
    current: str | None = None
    versions: list[str] = field(default_factory=list)
    source: str = ""
    path: str = ""


@dataclass(frozen=True)
class DataStatusReply(Reply):
    """``invoker data status``: the project's entries on this node, and the free bytes where they live."""

    entries: list[EntryState] = field(default_factory=list)
    free_bytes: int = 0
    missing: list[str] = field(default_factory=list)
    """With ``--missing``: the objects of the request (on stdin) this node does not hold."""

    def entry(self, name: str) -> EntryState | None:
        return next((e for e in self.entries if e.name == name), None)


@dataclass(frozen=True)
class MissingRequest(Typed):
    """stdin of ``invoker data missing``: the objects the laptop would send."""

    shas: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class MissingReply(Reply):
    """The objects of the request this node does not hold yet."""

    missing: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PutReply(Reply):
    """``invoker data put`` / ``fetch``: how many objects (and bytes) were stored, each verified."""

    stored: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class CommitRequest(Typed):
    """stdin of ``invoker data commit``: make this manifest entry ``name``'s current version."""

    name: str = field(metadata=rule(check=check_data_name))
    manifest: Manifest
    source: str = ""
    dest: str = field(default="", metadata=rule(check=lambda v: check_data_dest(v) if v else None))
    """A path under the node's state directory that links to the current version (the entry's ``dest:``)."""


@dataclass(frozen=True)
class CommitReply(Reply):
    """The version now ``current``, its directory, and whether it was built now (False: it was there)."""

    name: str = field(metadata=rule(check=check_data_name))
    current: str = field(metadata=rule(check=_version))
    path: str = ""
    built: bool = False


@dataclass(frozen=True)
class ServeRequest(Typed):
    """stdin of ``invoker data serve``: the transfer's token (32 random bytes, hex) and how many peers come."""

    token: str
    clients: int = 1
    wait: bool = False
    """Objects not here yet are waited for (they are arriving from the laptop or the node before this
    one), and sent as they appear: the chain's copies follow the upload instead of polling for it."""


@dataclass(frozen=True)
class ServeReady(Typed):
    """The serving node's first line: the port it listens on."""

    port: int


@dataclass(frozen=True)
class FetchRequest(Typed):
    """stdin of ``invoker data fetch``: where the peer serves, the token, the objects to take."""

    host: str
    port: int
    token: str
    shas: list[str] = field(default_factory=list)
    commits: list[CommitRequest] = field(default_factory=list)
    """Versions to make current once the objects are in (saves a command per node)."""


@dataclass(frozen=True)
class Want(Typed):
    """A fetching node's request, after the handshake: these objects, in this order."""

    TAG: ClassVar[str] = "want"
    shas: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ObjectHeader(Typed):
    """One object on a data stream: this line, then exactly ``size`` bytes (stdin of ``put``, a peer's socket)."""

    sha256: str = field(metadata=rule(check=_sha256))
    size: int = field(metadata=rule(check=not_negative))


@dataclass(frozen=True)
class PruneDataReply(Reply):
    """``invoker data prune``: the versions and objects removed (or that would be), and the bytes freed."""

    removed: list[str] = field(default_factory=list)
    objects: int = 0
    freed_bytes: int = 0


@dataclass(frozen=True)
class IngestRequest(Typed):
    """stdin of ``invoker data ingest``: a URL or Hub source to download on the node, and the secrets it needs
    (the credentials; sent here, on stdin, only)."""

    source: str
    revision: str = ""
    secrets: dict[str, str] = field(default_factory=dict)
    dest: str = field(default="", metadata=rule(check=lambda v: check_data_dest(v) if v else None))


@dataclass(frozen=True)
class IngestReply(Reply):
    """What a node downloaded and made current: the manifest the other nodes copy, and its version."""

    manifest: Manifest
    current: str = field(metadata=rule(check=_version))
    path: str = ""


#: The fsspec URL schemes a ``data:`` source may use (fetched on a node), and the Hugging Face Hub's.
URL_SCHEMES = ("s3", "gs", "gcs", "https", "http", "sftp", "file")
HUB_SCHEME = "hf"


def source_kind(source: str) -> str:
    """``path`` (on the laptop), ``url`` (fsspec, fetched on a node) or ``hub`` (``hf://org/repo``);
    ValueError for a scheme no one reads."""
    m = re.match(r"\A([A-Za-z][A-Za-z0-9+.-]*)://(.*)\Z", source, re.S)
    if m is None:
        if not source.strip() or "\0" in source:
            raise ValueError("is empty: give a path, an fsspec URL (s3://...) or hf://org/repo")
        return "path"
    scheme, rest = m.group(1).lower(), m.group(2)
    if scheme == HUB_SCHEME:
        if not re.fullmatch(r"(datasets/|models/)?[A-Za-z0-9][\w.-]*/[\w.-]+", rest):
            raise ValueError(f"{shown(source)} is not a Hub repo: use hf://org/name (or hf://datasets/org/name)")
        return "hub"
    if scheme not in URL_SCHEMES:
        raise ValueError(f"{shown(source)}: unknown scheme '{scheme}://': use a path, "
                         f"{', '.join(s + '://' for s in URL_SCHEMES)} or hf://org/repo")
    if not rest.strip("/"):
        raise ValueError(f"{shown(source)} names no bucket or path")
    return "url"


@dataclass(frozen=True)
class PushedEntry(Typed):
    """One entry of a push, as ``data push --json`` prints it."""

    name: str
    version: str
    source: str
    files: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class PushedNode(Typed):
    """One node's part of a push: its last state, the bytes it received, from where, and the rate."""

    node: str
    state: str
    bytes: int = 0
    via: str = ""
    rate: float = 0.0


@dataclass(frozen=True)
class PushReport(Typed):
    """``higgsfield data push --json``."""

    entries: list[PushedEntry] = field(default_factory=list)
    nodes: list[PushedNode] = field(default_factory=list)
    uplink_bytes: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class HashCache(Typed):
    """The laptop's cache of one entry's sha256s (``.higgsfield/data-cache/<name>.json``), valid for ``root``
    only: one line per file, ``path NUL size NUL mtime_ns NUL inode NUL sha256``, all in one string (10,000
    files decode in a millisecond as one string; as a list of strings the codec took 90 ms, as objects a
    third of a second)."""

    root: str
    lines: str = ""

    def check(self) -> None:
        """No bound on ``lines``: the laptop's own file, one line per file of the entry (any number)."""

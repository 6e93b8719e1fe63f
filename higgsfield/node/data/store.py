"""A project's data entries on this node: the object store, versions, and the ``current`` link.

::

    <state>/data/<project>/
        objects/<sha[:2]>/<sha256>            every file once, by content (0444), verified as it arrived
        objects/.incoming/                    objects being received (a cut transfer leaves only these)
        entries/<name>/versions/<version>/    one version: hard links to the objects, directories 0555
        entries/<name>/versions/.staging-*    a version being built (never read)
        entries/<name>/current -> versions/<version>   swapped by rename: old or whole new, never a mix
        entries/<name>/source                 what the current version came from (shown by doctor)

An object is written under ``.incoming``, its sha256 computed as it is written, and renamed into
place only when it matches: so a transfer cut at any byte resumes by asking what is missing
(:func:`missing`), and no half-written object is ever a version's file. A run is given the
version directory the link resolves to (:func:`run_paths`), so a later push never changes the
files under a running run.

Use::

    store = Store(home, "demo")
    store.receive(sys.stdin.buffer)          # ObjectHeader line + bytes, repeated
    store.commit(CommitRequest(name="corpus", manifest=m))
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from higgsfield.contract import codec, layout
from higgsfield.contract.data import (
    CommitReply,
    CommitRequest,
    DataError,
    DataStatusReply,
    EntryState,
    ObjectHeader,
    PruneDataReply,
    PutReply,
    check_data_dest,
    check_data_name,
)
from higgsfield.contract.decode import DecodeError, loads
from higgsfield.node.state.home import NodeState

CHUNK = 1 << 20
MAX_HEADER = 4096
INCOMING = ".incoming"
STAGING = ".staging-"


class Store:
    """The data of ``project`` under ``home`` (module doc)."""

    def __init__(self, home: NodeState, project: str) -> None:
        self.home = home.root
        self.root = home.root / layout.data_dir(project)
        self.objects = self.root / "objects"
        self.entries = self.root / "entries"

    def make(self) -> None:
        for d in (self.root, self.objects, self.objects / INCOMING, self.entries):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)

    def object_path(self, sha: str) -> Path:
        return self.objects / sha[:2] / sha

    def has(self, sha: str, size: int | None = None) -> bool:
        try:
            st = self.object_path(sha).stat()
        except OSError:
            return False
        return size is None or st.st_size == size

    def missing(self, shas: list[str]) -> list[str]:
        return [s for s in dict.fromkeys(shas) if not self.has(s)]

    # -- receiving objects ----------------------------------------------------------------------------

    def receive(self, stream: BinaryIO, *, progress: Callable[[PutReply], None] | None = None) -> PutReply:
        """Store every object on ``stream`` (an :class:`ObjectHeader` line, then its bytes) until its end.

        Each is verified against its sha256 before it is renamed into place; a stream cut inside an
        object leaves nothing but a temporary file, removed here. DataError for a mismatch.
        """
        self.make()
        stored = nbytes = 0
        while True:
            line = stream.readline(MAX_HEADER)
            if not line:
                break
            if not line.endswith(b"\n"):
                raise DataError("the data stream broke inside an object header")
            if not line.strip():
                continue
            try:
                head = codec.decode(ObjectHeader, loads(line))
            except DecodeError as e:
                raise DataError(f"the data stream sent a bad object header: {e}") from None
            if self._store_one(stream, head):
                stored += 1
            nbytes += head.size
            if progress is not None:
                progress(PutReply(stored=stored, bytes=nbytes))
        return PutReply(stored=stored, bytes=nbytes)

    def _store_one(self, stream: BinaryIO, head: ObjectHeader) -> bool:
        tmp = self.objects / INCOMING / f"{head.sha256}.{secrets.token_hex(4)}"
        h = hashlib.sha256()
        left = head.size
        try:
            with open(tmp, "wb", opener=_private) as f:
                while left:
                    chunk = stream.read(min(CHUNK, left))
                    if not chunk:
                        raise DataError(f"the data stream ended inside object {head.sha256[:12]} "
                                        f"({left} bytes short): push again to resume")
                    h.update(chunk)
                    f.write(chunk)
                    left -= len(chunk)
            if h.hexdigest() != head.sha256:
                raise DataError(f"object {head.sha256[:12]} arrived with other bytes (sha256 "
                                f"{h.hexdigest()[:12]}): it changed while it was sent; push again")
            if self.has(head.sha256, head.size):
                return False
            dest = self.object_path(head.sha256)
            dest.parent.mkdir(mode=0o700, exist_ok=True)
            tmp.chmod(0o444)
            os.replace(tmp, dest)
            return True
        finally:
            tmp.unlink(missing_ok=True)

    def open_object(self, sha: str) -> BinaryIO:
        return open(self.object_path(sha), "rb")

    # -- versions -------------------------------------------------------------------------------------

    def entry_dir(self, name: str) -> Path:
        check_data_name(name)
        return self.entries / name

    def commit(self, req: CommitRequest) -> CommitReply:
        """Make ``req.manifest`` entry ``req.name``'s current version: verify, stage, rename, swap the link."""
        version = req.manifest.version()
        edir = self.entry_dir(req.name)
        versions = edir / "versions"
        final = versions / version
        current = edir / "current"
        absent = [f.path for f in req.manifest.files if not self.has(f.sha256, f.size)]
        if absent:
            raise DataError(f"data '{req.name}': {len(absent)} file(s) are missing on this node "
                            f"({absent[0]}...): push again")
        built = False
        if not final.is_dir():
            versions.mkdir(mode=0o700, parents=True, exist_ok=True)
            staging = versions / f"{STAGING}{secrets.token_hex(6)}"
            staging.mkdir(mode=0o700)
            try:
                for f in req.manifest.files:
                    dest = staging / f.path
                    dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                    os.link(self.object_path(f.sha256), dest)
                for d in sorted((p for p in staging.rglob("*") if p.is_dir()), reverse=True):
                    d.chmod(0o555)
                staging.chmod(0o555)
                os.rename(staging, final)
                built = True
            finally:
                if staging.exists():
                    _remove_tree(staging)
        link_tmp = edir / f".current-{secrets.token_hex(4)}"
        os.symlink(f"versions/{version}", link_tmp)
        os.replace(link_tmp, current)
        if req.dest:
            self._link_dest(req.name, req.dest, final)
        src = edir / "source"
        tmp = edir / f".source-{secrets.token_hex(4)}"
        tmp.write_text(req.source)
        os.replace(tmp, src)
        return CommitReply(name=req.name, current=version, path=str(final), built=built)

    def _link_dest(self, name: str, dest: str, version: Path) -> None:
        """``<state>/<dest>`` -> the version directory, swapped by rename; a file or directory of the user's
        there is never replaced (DataError)."""
        check_data_dest(dest)
        link = self.home / dest.rstrip("/")
        if os.path.lexists(link) and not link.is_symlink():
            raise DataError(f"data '{name}': dest {link} exists and is not this entry's link: move it away or "
                            "choose another dest")
        link.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = link.parent / f".{link.name}-{secrets.token_hex(4)}"
        os.symlink(version.resolve(), tmp)
        os.replace(tmp, link)

    def current(self, name: str) -> str | None:
        try:
            target = os.readlink(self.entry_dir(name) / "current")
        except OSError:
            return None
        version = Path(target).name
        return version if (self.entries / name / "versions" / version).is_dir() else None

    def names(self) -> list[str]:
        try:
            return sorted(p.name for p in self.entries.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            return []

    def status(self) -> DataStatusReply:
        out = []
        for name in self.names():
            vdir = self.entries / name / "versions"
            versions = sorted(p.name for p in vdir.iterdir() if not p.name.startswith(".")) if vdir.is_dir() else []
            cur = self.current(name)
            try:
                source = (self.entries / name / "source").read_text()[:2000]
            except OSError:
                source = ""
            out.append(EntryState(name=name, current=cur, versions=versions, source=source,
                                  path=str(vdir / cur) if cur else ""))
        probe = next((p for p in (self.root, *self.root.parents) if p.exists()), self.root)
        try:   # the nearest directory that exists: a first push finds no state directory yet
            free = shutil.disk_usage(probe).free
        except OSError:
            free = 0
        return DataStatusReply(entries=out, free_bytes=free)   # objects not counted: a push asks this each time

    def prune(self, *, keep: set[str] | None = None, dry_run: bool = False) -> PruneDataReply:
        """Remove every version that is not current (nor in ``keep``), then the objects no version links."""
        removed: list[str] = []
        freed = 0
        for name in self.names():
            vdir = self.entries / name / "versions"
            cur = self.current(name)
            for v in sorted(vdir.iterdir()) if vdir.is_dir() else []:
                if v.name == cur or v.name in (keep or set()):
                    continue
                removed.append(f"{name}/{v.name}")
                if not dry_run:
                    _remove_tree(v)
        objects = 0
        if self.objects.is_dir():
            for p in list(self.objects.glob("??/*")) + list((self.objects / INCOMING).glob("*")):
                with contextlib.suppress(OSError):
                    st = p.stat()
                    if st.st_nlink <= 1 and (not dry_run or p.parent.name == INCOMING):
                        objects += 1
                        freed += st.st_size
                        if not dry_run:
                            p.unlink()
        return PruneDataReply(removed=removed, objects=objects, freed_bytes=freed)


def run_paths(home: NodeState, project: str) -> dict[str, str]:
    """Each entry's current version directory on this node (what a starting run is given), by name."""
    store = Store(home, project)
    out = {}
    for name in store.names():
        cur = store.current(name)
        if cur is not None:
            out[name] = str(store.entries / name / "versions" / cur)
    return out


def data_variables(home: NodeState, project: str) -> dict[str, str]:
    """``HIGGSFIELD_DATA`` (every entry's path, JSON) and ``HIGGSFIELD_DATA_<NAME>`` per entry."""
    from higgsfield.contract.data import DATA_VAR, data_var

    paths = run_paths(home, project)
    if not paths:
        return {}
    return {DATA_VAR: json.dumps(paths, sort_keys=True), **{data_var(n): p for n, p in paths.items()}}


def _private(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_EXCL, 0o600)


def _remove_tree(path: Path) -> None:
    """Remove a version tree whose directories are read-only (0555)."""
    for d in [path, *(p for p in path.rglob("*") if p.is_dir() and not p.is_symlink())]:
        with contextlib.suppress(OSError):
            d.chmod(0o700)
    shutil.rmtree(path, ignore_errors=True)

"""A laptop path as a data entry's manifest (path, size, sha256 of every file), and its files' bytes, checked.

Hashing is what a re-push of an unchanged entry would pay for, so each file's sha256 is kept
in ``.higgsfield/data-cache/<name>.json`` beside its size, mtime and inode: a file whose
``stat`` is unchanged is not read again (what ``git`` and ``rsync`` trust too). A file is read
again when it is sent, and its bytes must hash to the manifest's sha256, else the push stops
(one line: the file changed while it was pushed) before any node makes the version current.

Use::

    m = scan(Path("corpus"), cache=cfg.project_dir / ".higgsfield" / "data-cache" / "corpus.json")
    data = read_checked(Path("corpus"), m.files[0])
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from higgsfield.contract import codec
from higgsfield.contract.data import DataError, DataFile, HashCache, Manifest

CHUNK = 1 << 20


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _walk(root: Path) -> list[tuple[str, os.stat_result]]:
    """Every regular file under ``root`` (symlinks followed to files, not into directories), sorted by path."""
    if root.is_file():
        return [(root.name, root.stat())]
    out: list[tuple[str, os.stat_result]] = []
    todo = [("", str(root))]
    while todo:
        rel, path = todo.pop()
        with os.scandir(path) as it:
            for d in it:
                name = f"{rel}{d.name}"
                try:
                    if d.is_dir(follow_symlinks=False):
                        todo.append((name + "/", d.path))
                    elif d.is_file():
                        out.append((name, d.stat()))
                except OSError:
                    continue   # a dangling link, a file gone meanwhile
    out.sort(key=lambda x: x[0])
    return out


def scan(root: Path, *, cache: Path | None = None, name: str = "") -> Manifest:
    """The manifest of ``root`` (a directory, or one file); DataError when it does not exist."""
    if not root.exists():
        raise DataError(f"data '{name}': {root} does not exist: fix its source in higgsfield.yml")
    where = str(root.resolve())
    known: dict[str, list[str]] = {}
    old_lines = ""
    if cache is not None:
        with contextlib.suppress(OSError, ValueError):   # absent, not JSON, not a cache (DecodeError): hash
            old = codec.decode(HashCache, json.loads(cache.read_text()))
            if old.root == where:
                old_lines = old.lines
                known = {parts[0]: parts for line in old.lines.split("\n") if len(parts := line.split("\0")) == 5}
    files, fresh = [], []
    single = not root.is_dir()
    for rel, st in _walk(root):
        key = [rel, str(st.st_size), str(st.st_mtime_ns), str(st.st_ino)]
        seen = known.get(rel)
        sha = seen[4] if seen is not None and seen[:4] == key else _sha256(root if single else root / rel)
        fresh.append("\0".join([*key, sha]))
        files.append(DataFile(path=rel, size=st.st_size, sha256=sha))
    lines = "\n".join(fresh)
    if cache is not None and lines != old_lines:   # unchanged: not written again (a re-push only reads)
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        tmp.write_text(json.dumps(codec.encode(HashCache(root=where, lines=lines))))
        os.replace(tmp, cache)
    return Manifest(files=files)


def read_checked(root: Path, f: DataFile, name: str = "") -> bytes:
    """The bytes of ``f`` under ``root``, which must still hash to the manifest's sha256 (DataError if not)."""
    path = root / f.path if root.is_dir() else root
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"data '{name}': {path} cannot be read ({e.strerror or e}): it changed during the "
                        "push; push again") from None
    if len(data) != f.size or hashlib.sha256(data).hexdigest() != f.sha256:
        raise DataError(f"data '{name}': {path} changed during the push (its bytes no longer match the "
                        "manifest): nothing was made current; push again once it is written")
    return data

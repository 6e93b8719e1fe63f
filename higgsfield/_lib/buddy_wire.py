"""A checkpoint part sent from one node's lead to another's over the run's own gloo group, checked on arrival.

Used by :mod:`higgsfield._lib.ckpt_buddy` for the buddy copies (after each save, in
the background) and for the parts a resume moves between nodes. Its own module
because the transfer (a manifest, then each file in chunks, every file's sha256
checked before the copy is renamed into place) is one concept apart from when it happens.

Why torch.distributed and not a socket of our own: the ranks already share an
authenticated rendezvous and a process group over the nodes' own network, so no
port, no key and no node-to-node shell is added. Both ends must call in the same
order (gloo matches a send to a receive by peer); :func:`send_part` and
:func:`recv_part` are each other's mirror image.

A copy lies in a directory with a ``REPLICA`` manifest (every file's size and
sha256, and the part's own ``COMPLETE`` marker): :func:`verify` checks a copy
against it before it is used, so a copy damaged on disk is never loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["MANIFEST", "manifest", "recv_part", "send_part", "verify"]

MANIFEST = "REPLICA"
CHUNK = 16 << 20   # bytes per message: a part of any size crosses in bounded memory


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def manifest(part_dir: Path, step: int, part: int) -> dict[str, Any]:
    """What a copy of ``part_dir`` must hold: every file (relative path -> [size, sha256]) and its marker."""
    files = {}
    for p in sorted(part_dir.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            files[p.relative_to(part_dir).as_posix()] = [p.stat().st_size, _sha256(p)]
    marker = json.loads((part_dir / "COMPLETE").read_text())
    return {"step": step, "part": part, "files": files, "marker": marker}


def verify(copy_dir: Path) -> str | None:
    """None if the copy at ``copy_dir`` matches its manifest, else what is wrong (one line)."""
    try:
        man = json.loads((copy_dir / MANIFEST).read_text())
        files = man["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{copy_dir}: no readable {MANIFEST} manifest ({type(e).__name__})"
    for rel, (size, digest) in files.items():
        path = copy_dir / rel
        if not path.is_file() or path.stat().st_size != size:
            return f"{path}: missing or of the wrong size"
        if _sha256(path) != digest:
            return f"{path}: checksum mismatch"
    return None


def _send_bytes(data: bytes, dst: int, group: Any) -> None:
    dist.send(torch.tensor([len(data)], dtype=torch.int64), dst, group=group)
    if data:
        dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst, group=group)


def _recv_bytes(src: int, group: Any) -> bytes:
    n = torch.zeros(1, dtype=torch.int64)
    dist.recv(n, src, group=group)
    if not int(n):
        return b""
    buf = torch.empty(int(n), dtype=torch.uint8)
    dist.recv(buf, src, group=group)
    return buf.numpy().tobytes()


def send_part(part_dir: Path, man: dict[str, Any], dst: int, group: Any) -> None:
    """Send the part at ``part_dir`` (described by ``man``, see :func:`manifest`) to global rank ``dst``."""
    _send_bytes(json.dumps(man).encode(), dst, group)
    for rel, (size, _) in man["files"].items():
        with open(part_dir / rel, "rb") as f:
            for _ in range(0, size, CHUNK):
                _send_bytes(f.read(CHUNK), dst, group)


def recv_part(src: int, into: Path, group: Any) -> dict[str, Any]:
    """Receive a part from global rank ``src`` into the directory ``into`` (made here, replaced if there), every
    file checked against the sender's manifest before the directory is renamed into place; the manifest."""
    man = json.loads(_recv_bytes(src, group))
    tmp = into.with_name(f".tmp-{into.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    bad = []
    for rel, (size, digest) in man["files"].items():
        target = tmp / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        with open(target, "wb") as f:
            for _ in range(0, size, CHUNK):
                block = _recv_bytes(src, group)
                h.update(block)
                f.write(block)
        if h.hexdigest() != digest:
            bad.append(rel)
    if bad:  # every byte was read, so the wire stays in step; the copy is not kept
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(f"the copy of part {man.get('part')} of step {man.get('step')} arrived damaged: {bad[0]}")
    (tmp / MANIFEST).write_text(json.dumps(man))
    if into.exists():
        shutil.rmtree(into)
    os.rename(tmp, into)
    return man

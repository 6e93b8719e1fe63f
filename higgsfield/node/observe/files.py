"""What ``higgsfield pull`` may copy from this node: a run's checkpoint part and its logs, listed with sizes and sha256.

::

    higgsfield invoker files --project P --run R                       # {"root", "steps": [complete steps]}
    higgsfield invoker files --project P --run R --step step_00000012  # + "files": [{path, size, sha256}], "marker"
    higgsfield invoker files --project P --run R --logs                # the run dir: run.json, spec.json, logs/*

The control side copies each listed file by its path under ``root`` (SFTP, or a plain
copy on ``localhost``) and checks it against the sha256 computed here, on the node,
where the bytes are. So the listing is the whole of what a pull can reach: it never
leaves the run's checkpoint directory (named by the run's own ``spec.json``) or its run
directory, never follows a symlink (a file or a directory that is one is left out) and
gives only relative paths of plain files, with no ``..`` in them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from higgsfield.contract import layout
from higgsfield.contract.errors import RunError
from higgsfield.contract.replies_disk import FileEntry, FilesReply
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.placement import NodeRun
from higgsfield.node.state.records import RunDir

MARKER = "COMPLETE"     # higgsfield.checkpoint.MARKER (the node agent never imports the training library)
STEP_RE = re.compile(r"step_\d{8}")
LOG_FILES = (layout.RECORD, layout.SPEC)  # besides logs/: the record and the pinned spec (no secrets in either)
MARKER_MAX = 1 << 16


def describe(home: NodeState, project: str, run: str, *, step: str | None = None, logs: bool = False) -> FilesReply:
    """The reply of ``invoker files`` (see the module docstring); RunError in one line for a run or step not here."""
    rd = RunDir(home, project, run)
    if not rd.exists():
        raise RunError(f"no run '{run}' of project '{project}' on this node")
    if logs:
        names = [n for n in LOG_FILES if _plain_file(rd.path / n)] + [f"{layout.LOGS}/{p}" for p in _walk(rd.logs)]
        return FilesReply(root=str(rd.path), files=[_entry(rd.path, n) for n in names])
    root = Path(NodeRun.read(rd.spec_path).placement.checkpoint_dir)
    steps = complete_steps(root)
    if step is None:
        return FilesReply(root=str(root), steps=steps)
    if not STEP_RE.fullmatch(step) or step not in steps:
        raise RunError(f"no complete checkpoint {step} of run '{run}' in {root} on this node")
    names = [f"{step}/{p}" for p in _walk(root / step) if p != MARKER]
    marker = _marker(root / step / MARKER)
    return FilesReply(root=str(root), steps=steps, files=[_entry(root, n) for n in names],
                      marker=marker if isinstance(marker, dict) else None)


def complete_steps(root: Path) -> list[str]:
    """The ``step_*`` directories of ``root`` (no symlinks) holding a ``COMPLETE`` marker, oldest first."""
    if not _plain_dir(root):
        return []
    return sorted(e.name for e in os.scandir(root)
                  if STEP_RE.fullmatch(e.name) and _plain_dir(root / e.name) and _plain_file(root / e.name / MARKER))


def _walk(base: Path) -> list[str]:
    """Relative paths of the plain files under ``base`` (sorted), descending only into plain directories."""
    if not _plain_dir(base):
        return []
    found: list[str] = []
    for e in sorted(os.scandir(base), key=lambda e: e.name):
        if e.is_symlink():
            continue
        if e.is_dir(follow_symlinks=False):
            found += [f"{e.name}/{p}" for p in _walk(base / e.name)]
        elif e.is_file(follow_symlinks=False):
            found.append(e.name)
    return found


def _entry(root: Path, rel: str) -> FileEntry:
    """One file: its path under ``root``, size and sha256 (read in chunks: checkpoint shards are large)."""
    digest = hashlib.sha256()
    size = 0
    with open(root / rel, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return FileEntry(path=rel, size=size, sha256=digest.hexdigest())


def _marker(path: Path) -> Any:
    """The step's ``COMPLETE`` marker decoded (the pull rewrites it for the merged step); None if not JSON."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read(MARKER_MAX))
    except (OSError, ValueError):
        return None


def _plain_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _plain_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False

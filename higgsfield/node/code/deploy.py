"""Deployed code and the project's image on one node (node side of ``higgsfield deploy``).

::

    <state>/projects/<project>/
        releases/<commit12>-<time>/   one unpacked tree per deploy, with .higgsfield-commit
        code -> releases/...          a symlink, swapped atomically (rename) by each deploy
        deployed.json                 {commit, dirty, release, deployed_at}
        image.json                    {tag, dockerfile, base_image, built_at, python, cuda, packages}
        build.log                     the last docker build's output

A deploy unpacks the tar it is sent into a fresh directory and only then swaps the
``code`` link, so a reader (a starting run) sees the old tree or the new one, never a
half-written one. A run pins the release it started with (``launch`` resolves the
link), and pruning keeps the releases of active runs.

The image tag is a hash of the Dockerfile, requirements.txt and the base image
(:func:`higgsfield.node.runtime.containers.image_tag`): an unchanged image is never rebuilt.
After a build, the image's Python is asked for its packages once
(:mod:`higgsfield.node.code.image_facts`): equal tags on two nodes need not mean equal packages.
The image holds no higgsfield of its own that runs depend on: every run mounts the
invoker's package (:mod:`higgsfield.node.runtime.containers`), so the nodes' exact build
(a checkout, a fork, a pre-release) runs without any package index, and an invoker
upgrade needs no rebuild. ``runtime: process`` gets a venv instead of an image
(:mod:`higgsfield.node.code.environment`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tarfile
import time
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import IO, Any

from higgsfield.contract import layout
from higgsfield.contract.codec import decode, encode
from higgsfield.contract.errors import RunError
from higgsfield.contract.replies import BuildReply, Deployment
from higgsfield.contract.states import ACTIVE
from higgsfield.node.code import image_facts
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.placement import read_run_spec
from higgsfield.node.state.records import list_runs, write_json

COMMIT_FILE = ".higgsfield-commit"
KEEP_RELEASES = 3


def deployed(home: NodeState, project: str) -> Deployment | None:
    """What is deployed (commit, release, code dir), verified against the tree's commit file; None if nothing."""
    root = home.project(project)
    try:
        info = decode(Deployment, json.loads((root / layout.DEPLOYED).read_text()))
    except (OSError, ValueError):   # absent, not JSON, or not a deployment (DecodeError)
        return None
    code = home.code(project)
    try:
        on_disk = (code / COMMIT_FILE).read_text().strip()
    except OSError:
        return None
    if on_disk != info.commit:
        return None
    return replace(info, code_dir=str(code.resolve()), image=current_image(home, project))


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _safe_members(tar: tarfile.TarFile, dest: Path) -> Any:
    """The archive's members, refused when one would land (or link) outside ``dest``.

    Checked as the members are extracted (this is a generator consumed between
    extractions), against the tree *as it is on disk*: paths are resolved with
    ``realpath``, so a chain of links unpacked earlier (``a -> ..`` then ``a/l -> ../..``)
    cannot smuggle a later member out of the tree.
    """
    root = os.path.realpath(dest)
    for m in tar:
        name = PurePosixPath(m.name)
        if name.is_absolute() or ".." in name.parts:
            raise RunError(f"refusing unsafe path in the code archive: {m.name}")
        if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            continue  # devices, fifos: never part of a project
        parent = os.path.realpath(os.path.join(root, *name.parent.parts))
        if not _inside(root, parent):
            raise RunError(f"refusing path through a link out of the project in the code archive: {m.name}")
        if m.issym() or m.islnk():
            base = parent if m.issym() else root
            target = os.path.realpath(os.path.join(base, m.linkname))
            if PurePosixPath(m.linkname).is_absolute() or not _inside(root, target):
                raise RunError(f"refusing link out of the project in the code archive: {m.name} -> {m.linkname}")
        m.mode = (m.mode | 0o600) & 0o755 if not m.isdir() else 0o755
        m.uid = m.gid = os.getuid()
        m.uname = m.gname = ""
        yield m


def _extract(tar: tarfile.TarFile, m: tarfile.TarInfo, dest: Path) -> None:
    """Extract one checked member; where tarfile has extraction filters (3.11.4+), also through ``data``."""
    if hasattr(tarfile, "data_filter"):
        try:
            tar.extract(m, dest, set_attrs=not m.issym(), filter="data")
        except tarfile.FilterError as e:
            raise RunError(f"refusing unsafe member of the code archive: {e}") from None
    else:  # pragma: no cover - Python < 3.11.4: the realpath checks of _safe_members are the guard
        tar.extract(m, dest, set_attrs=not m.issym())


def unpack(home: NodeState, project: str, commit: str, stream: IO[bytes], *, dirty: bool = False) -> Deployment:
    """Unpack a tar of the project (read from ``stream``) as the new release, then swap ``code`` to it."""
    root = home.project(project)
    releases = root / layout.RELEASES
    releases.mkdir(parents=True, exist_ok=True)
    name = f"{commit[:12]}-{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(2)}"
    tmp = releases / f".incoming-{name}"
    tmp.mkdir()
    try:
        with tarfile.open(fileobj=stream, mode="r|*") as tar:
            for m in _safe_members(tar, tmp):
                _extract(tar, m, tmp)
        (tmp / COMMIT_FILE).write_text(commit + "\n")
        release = releases / name
        os.rename(tmp, release)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    link_tmp = root / f".code-{secrets.token_hex(4)}"
    os.symlink(Path(layout.RELEASES) / name, link_tmp)
    os.replace(link_tmp, home.code(project))
    write_json(root / layout.DEPLOYED, {"commit": commit, "dirty": dirty, "release": name,
                                        "deployed_at": time.time()})
    prune(home, project)
    info = deployed(home, project)
    if info is None or info.commit != commit:
        raise RunError(f"deploy of {commit[:12]} did not verify on this node")
    return info


def prune(home: NodeState, project: str, keep: int = KEEP_RELEASES) -> list[str]:
    """Remove old releases: all but the newest ``keep``, the current one and those of active runs."""
    root = home.project(project)
    releases = root / layout.RELEASES
    if not releases.is_dir():
        return []
    current = home.code(project).resolve() if home.code(project).exists() else None
    in_use = {current}
    for rd in list_runs(home, project):
        with contextlib.suppress(OSError, ValueError, RunError):
            if rd.read().state in ACTIVE:
                in_use.add(Path(read_run_spec(rd.spec_path).code_dir).resolve())
    dirs = sorted((d for d in releases.iterdir() if d.is_dir() and not d.name.startswith(".")),
                  key=lambda d: d.stat().st_mtime, reverse=True)
    removed = []
    for d in dirs[keep:]:
        if d.resolve() not in in_use:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d.name)
    for d in releases.glob(".incoming-*"):  # left by an interrupted deploy
        if time.time() - d.stat().st_mtime > 3600:
            shutil.rmtree(d, ignore_errors=True)
    return removed


def image_record(home: NodeState, project: str) -> image_facts.ImageRecord:
    """image.json as deploy last wrote it (an empty record when there is none, or it does not decode)."""
    return image_facts.read_image_record(home.project(project) / layout.IMAGE)


def current_image(home: NodeState, project: str) -> str | None:
    return image_record(home, project).tag


def build(home: NodeState, project: str, *, code_dir: Path | None = None, dockerfile: str = "Dockerfile",
          base_image: str | None = None, runtime: str = "auto") -> BuildReply:
    """Build the project's image unless an image with its tag exists; returns what happened.

    ``runtime: process`` skips; ``auto`` skips when Docker or the Dockerfile is missing.
    """
    from higgsfield.node.runtime import containers

    root = home.project(project)
    code = Path(code_dir) if code_dir else home.code(project)
    if runtime == "process":
        return BuildReply(skipped="runtime: process")
    if not code.is_dir():
        raise RunError(f"project '{project}' is not deployed on this node ({code} is missing)")
    if not (code / dockerfile).is_file():
        if runtime == "auto":
            return BuildReply(skipped=f"no {dockerfile}: runs use the process runtime")
        raise RunError(f"runtime 'docker' needs {dockerfile} in the project")
    if not containers.available():
        if runtime == "auto":
            return BuildReply(skipped="no Docker engine answers: runs use the process runtime")
        raise RunError("no Docker engine answers on this node (is the user in the docker group? "
                       "run 'higgsfield setup')")
    tag = containers.image_tag(project, code.resolve(), dockerfile, base_image)
    t0 = time.monotonic()
    built = False
    if not containers.image_exists(tag):
        args = {"BASE_IMAGE": base_image} if base_image else {}
        containers.build_image(code.resolve(), tag, dockerfile=dockerfile, buildargs=args,
                               log_path=root / layout.BUILD_LOG)
        built = True
    before = image_facts.ImageRecord() if built else image_record(home, project)
    known = before.facts if before.tag == tag else None
    facts = known or image_facts.listed(tag)   # listed once per image: an unchanged one keeps its listing
    record = image_facts.ImageRecord(tag=tag, dockerfile=dockerfile, base_image=base_image,
                                     built_at=time.time() if built else None,
                                     packages=facts.packages if facts else None,
                                     python=facts.python if facts else None, cuda=facts.cuda if facts else None)
    write_json(root / layout.IMAGE, encode(record))
    return BuildReply(tag=tag, built=built, seconds=round(time.monotonic() - t0, 3))

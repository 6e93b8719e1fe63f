"""Removing finished runs, their checkpoints and unused images from one node (``higgsfield invoker prune``).

A busy node fills its disk run by run; this is what empties it, and what it never touches:

- **runs**: a finished run's directory (``<state>/runs/<project>/<run>/``: record, spec,
  logs) goes when it is selected: named (``runs``), older than ``older_than_s`` (by the
  time it ended), or past the newest ``keep_runs`` finished runs. A queued, starting or
  running run is never selected, by name or otherwise.
- **checkpoints**: a removed run's checkpoints go too only with ``checkpoints`` (they
  are what a re-used run name resumes from, and the costliest thing to lose).
- **images**: with ``images``, the project's Docker images (``hf-<project>:<hash>``)
  that no release on this node, no queued or running run and no container uses.

Safety, and why:

- A record that does not decode (a damaged ``run.json``, a symlink, a directory that is
  no run's) is **never removed**, only named in ``skipped``: its state is unknown, so it
  may belong to a run whose processes still write into it, and the damaged file is the
  evidence of what went wrong. The line names it so a person can remove it by hand.
- A record that says ``running`` is kept even if its supervisor died: ``higgsfield status``
  settles such a record (to failed), and the next prune removes it. A prune only reads.
- Nothing is followed through a symlink: the run listing skips linked directories
  (:func:`~higgsfield.node.state.records.scan_runs`), sizes are summed with ``lstat``,
  ``shutil.rmtree`` removes links without following them, and a checkpoint directory
  is removed only when it lies, link-free, under the project's checkpoint root.
- A run is removed under its start lock (``.lock``, taken without waiting): a start of the
  same name at that moment makes the prune skip it, and a record that turned active
  since the plan is kept. The directory is first renamed into ``<state>/trash/`` and
  removed there, so an interrupted prune leaves no half-removed run behind (the next
  prune empties the trash).

The dry run is the same plan, not applied: it lists exactly what a real prune removes
(barring a run that starts or ends in between).

Use::

    result = prune(home, "my_llama", PrunePolicy(older_than_s=30 * 86400, dry_run=True))
    result.runs, result.freed_bytes      # a PruneReply (higgsfield.contract.replies_disk)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from higgsfield.contract import layout
from higgsfield.contract.decode import DecodeError, is_plain_dir
from higgsfield.contract.names import NAME_RE, is_run_name
from higgsfield.contract.prunespec import PruneError, PrunePolicy
from higgsfield.contract.replies_disk import (
    FreeSpace,
    Kept,
    PrunedCheckpoint,
    PrunedImage,
    PrunedRun,
    PruneReply,
    UsageReply,
)
from higgsfield.contract.states import ACTIVE
from higgsfield.contract.text import shown
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import RunDir, RunRecord, scan_runs


@dataclass
class _Plan:
    runs: list[tuple[RunDir, RunRecord]] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def prune(home: NodeState, project: str, policy: PrunePolicy, now: float | None = None) -> PruneReply:
    """Remove (``policy.dry_run``: list) what ``policy`` selects on this node; what went (runs, checkpoints,
    images), what stayed and why (``kept``), the records skipped, the names not found, and the bytes freed.
    """
    if not NAME_RE.fullmatch(project):
        raise PruneError(f"{shown(project)} is not a project name")
    now = time.time() if now is None else now
    plan = _plan_runs(home, project, policy, now)
    runs: list[PrunedRun] = []
    checkpoints: list[PrunedCheckpoint] = []
    images: list[PrunedImage] = []
    notes: list[str] = []
    if not policy.dry_run:
        _empty_trash(home)
    for rd, record in plan.runs:
        ckpts = checkpoint_dirs(home, record) if policy.checkpoints else []
        entry = PrunedRun(run=record.run, experiment=record.experiment, state=record.state,
                          ended_at=finished_at(record), path=str(rd.path), bytes=du(rd.path))
        sizes = [(p, du(p)) for p in ckpts]
        if not policy.dry_run:
            why = _remove_run(rd, ckpts)
            if why is not None:
                plan.kept.append(Kept(run=record.run, why=why))
                continue
        runs.append(entry)
        checkpoints += [PrunedCheckpoint(run=record.run, path=str(p), bytes=n) for p, n in sizes]
    if policy.images:
        _images(home, project, policy.dry_run, images, plan.kept, notes)
    freed = sum(e.bytes for e in runs) + sum(e.bytes for e in checkpoints) + sum(e.bytes for e in images)
    return PruneReply(runs=runs, freed_bytes=freed, dry_run=policy.dry_run, checkpoints=checkpoints, images=images,
                      kept=plan.kept, skipped=plan.skipped, missing=plan.missing, notes=notes)


def finished_at(record: RunRecord) -> float:
    """When the run ended (for an older record without ``ended_at``: when it started, else was made)."""
    return record.ended_at or record.started_at or record.created_at


def _plan_runs(home: NodeState, project: str, policy: PrunePolicy, now: float) -> _Plan:
    """The finished runs that ``policy`` selects, newest first; active ones asked for by name are ``kept``."""
    plan = _Plan()
    dirs, plan.skipped = scan_runs(home, project)
    finished: list[tuple[RunDir, RunRecord]] = []
    found: set[str] = set()
    for rd in dirs:
        found.add(rd.run)   # a damaged one is found (and skipped), not missing
        try:
            record = rd.read()
        except (DecodeError, OSError) as e:
            plan.skipped.append(f"{e} (kept: a record that does not decode is never removed)"
                                if isinstance(e, DecodeError) else f"{rd.rel}/run.json: {e.strerror or e}")
            continue
        if record.state in ACTIVE:
            if record.run in policy.runs:
                plan.kept.append(Kept(run=record.run, why=record.state))
            continue
        finished.append((rd, record))
    plan.missing = [r for r in policy.runs if r not in found]
    finished.sort(key=lambda p: (finished_at(p[1]), p[1].run), reverse=True)
    for i, (rd, record) in enumerate(finished):
        old = policy.older_than_s is not None and now - finished_at(record) > policy.older_than_s
        if policy.runs:
            chosen = record.run in policy.runs and (policy.older_than_s is None or old)
        else:
            chosen = old or (policy.keep_runs is not None and i >= policy.keep_runs)
        if chosen:
            plan.runs.append((rd, record))
    return plan


def _remove_run(rd: RunDir, checkpoints: list[Path]) -> str | None:
    """Remove one run's directory and ``checkpoints`` under its start lock; why it was kept instead (None: removed).

    The checkpoints go first, while the lock is held: a start of the same name (which resumes
    from them) waits for it, and once the directory is renamed away a new start no longer would.
    """
    with _try_lock(rd.lock_file) as held:
        if not held:
            return "a start of this run name holds its lock"
        try:
            if rd.read().state in ACTIVE:
                return "it became active"
        except (DecodeError, OSError):
            return "its record no longer decodes"
        for ckpt in checkpoints:
            shutil.rmtree(ckpt, ignore_errors=True)
        trash = rd.home.trash
        trash.mkdir(mode=0o700, exist_ok=True)
        dest = trash / f"{rd.project}-{rd.run}-{secrets.token_hex(4)}"
        try:
            os.rename(rd.path, dest)
        except OSError:  # the runs on another filesystem than the state dir: removed where they are
            shutil.rmtree(rd.path, ignore_errors=True)
            return None
    shutil.rmtree(dest, ignore_errors=True)   # out of the runs: no lock needed
    return None


@contextlib.contextmanager
def _try_lock(lock_file: Path) -> Iterator[bool]:
    """The run's start lock if free now (True), never waiting: a start in progress wins (False)."""
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _empty_trash(home: NodeState) -> None:
    """What an interrupted prune left in ``<state>/trash/``."""
    trash = home.trash
    if is_plain_dir(trash):
        for entry in os.scandir(trash):
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)


# -- checkpoints ----------------------------------------------------------------------------------

def checkpoint_roots(home: NodeState, project: str) -> list[Path]:
    """Where this node keeps the project's checkpoints: ``~/.cache/higgsfield/<project>`` (SSH nodes, see
    :func:`higgsfield.node.runs.start.place`) and ``<state>/checkpoints/<project>`` (a Slurm workdir)."""
    return [layout.cache_dir(project), home.slurm_checkpoints(project)]


def checkpoint_dirs(home: NodeState, record: RunRecord) -> list[Path]:
    """The run's checkpoint directories that exist, each a real directory under a checkpoint root
    reached through no symlink below the root (a link there could point anywhere)."""
    exp, run = record.experiment, record.run
    if "/" in exp or exp in (".", "..") or not is_run_name(run):
        return []
    root_cache, root_slurm = checkpoint_roots(home, record.project)
    wanted = [(root_cache, (layout.EXPERIMENTS, exp, run)), (root_slurm, (run,))]
    out = []
    for root, parts in wanted:
        real_root = os.path.realpath(root)
        path = os.path.join(real_root, *parts)
        if os.path.realpath(path) == path and is_plain_dir(Path(path)):
            out.append(Path(path))
    return out


# -- images ---------------------------------------------------------------------------------------

def _images(home: NodeState, project: str, dry_run: bool, images: list[PrunedImage], kept: list[Kept],
            notes: list[str]) -> None:
    """The project's images that no release, active run or container uses: removed (or listed) into ``images``;
    those that stay into ``kept``."""
    from higgsfield.node.runtime import containers

    if not containers.available():
        notes.append("no Docker engine answers here: no image to prune")
        return
    docker = containers._sdk()
    keep = _images_in_use(home, project)
    cl = containers.client()
    try:
        used_ids = {c.attrs.get("ImageID") for c in cl.containers.list(all=True, sparse=True)}
        repo = containers.image_tag(project, Path(os.devnull)).partition(":")[0]   # the project's repository
        for img in cl.images.list(name=repo):
            tags = [t for t in img.tags if t.split(":")[0] == repo]
            if img.id in used_ids:
                kept += [Kept(image=t, why="a container uses it") for t in tags]
                continue
            going = [t for t in tags if t not in keep]
            kept += [Kept(image=t, why=keep[t]) for t in tags if t in keep]
            whole = len(going) == len(img.tags)   # its last tag goes: the image itself goes
            for i, tag in enumerate(going):
                if not dry_run:
                    try:
                        cl.images.remove(tag)
                    except docker.errors.APIError as e:
                        kept.append(Kept(image=tag, why=str(e.explanation or e)[:200]))
                        continue
                size = int(img.attrs.get("Size") or 0) if whole and i == len(going) - 1 else 0
                images.append(PrunedImage(tag=tag, id=img.id, bytes=size))
    finally:
        cl.close()


def _images_in_use(home: NodeState, project: str) -> dict[str, str]:
    """tag -> why it stays: the current release's image, those of the releases kept on disk, those
    of queued, starting and running runs."""
    from higgsfield.node.code import deploy
    from higgsfield.node.runtime import containers

    keep: dict[str, str] = {}
    root = home.project(project)
    info = deploy.image_record(home, project)
    releases = root / layout.RELEASES
    if is_plain_dir(releases):
        for rel in sorted(releases.iterdir()):
            if is_plain_dir(rel) and not rel.name.startswith("."):
                with contextlib.suppress(OSError):
                    tag = containers.image_tag(project, rel, info.dockerfile or "Dockerfile", info.base_image)
                    keep.setdefault(tag, "a release on this node uses it")
    current = deploy.current_image(home, project)
    if current:
        keep[current] = "the current release's image"
    for rd in scan_runs(home, project)[0]:
        with contextlib.suppress(DecodeError, OSError):
            record = rd.read()
            if record.state in ACTIVE and record.image:
                keep[record.image] = f"run {record.run} is {record.state}"
    return keep


# -- usage ----------------------------------------------------------------------------------------

def du(path: Path) -> int:
    """Bytes on disk under ``path`` (``du``: allocated blocks), never following a symlink."""
    total = 0
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    total += st.st_blocks * 512
    if not stat.S_ISDIR(st.st_mode):
        return total
    for top, dirs, files in os.walk(path, followlinks=False):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
    return total


def usage(home: NodeState, project: str) -> UsageReply:
    """What doctor shows: the state dir's and the project's checkpoints' bytes, and the free space of the
    filesystems they are on (``free``: one entry per filesystem)."""
    roots = checkpoint_roots(home, project) if NAME_RE.fullmatch(project) else []
    state_bytes = du(home.root)
    # the Slurm checkpoint root lies inside the state dir: counted there, and again as checkpoints
    ckpt_bytes = sum(du(r) for r in roots if is_plain_dir(r))
    free: list[FreeSpace] = []
    seen: set[int] = set()
    for what, p in (("state", home.root), *(("checkpoints", r) for r in roots)):
        here = _existing(p)
        try:
            dev = os.stat(here).st_dev
            if dev in seen:
                continue
            seen.add(dev)
            du_ = shutil.disk_usage(here)
        except OSError:
            continue
        free.append(FreeSpace(what=what, path=str(here), free_bytes=du_.free, total_bytes=du_.total))
    return UsageReply(state_dir=str(home.root), state_bytes=state_bytes, checkpoint_dirs=[str(r) for r in roots],
                      checkpoint_bytes=ckpt_bytes, free=free)


def _existing(p: Path) -> Path:
    """``p``, or its nearest existing ancestor (the filesystem a directory not made yet will be on)."""
    p = Path(p)
    while not p.exists() and p != p.parent:
        p = p.parent
    return p

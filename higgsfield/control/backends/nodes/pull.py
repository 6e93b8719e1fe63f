"""``higgsfield pull``: a run's checkpoint (every node's part, merged) and its logs, brought to this machine.

::

    result = await pull(cfg, "tiny-llama-1203", Path("pulled/tiny-llama-1203"), step=None, logs=True)
    # pulled/tiny-llama-1203/step_00000400/   .metadata, __0_0.distcp .. __3_0.distcp, trainer.pt, COMPLETE
    # pulled/tiny-llama-1203/logs/<node>/     run.json, spec.json, logs/rank<N>.log ...

Why a merge works: on nodes that share no disk each node keeps its part of a step
(:mod:`higgsfield.checkpoint`): its ranks' ``.distcp`` files, named by global rank, so
the parts never collide, and its own ``.metadata``, a valid global one in which the
items every rank holds alike point at that node's copy. Put in one directory, the parts
with node 0's ``.metadata`` are a whole checkpoint (node 0's copies are among them),
so for a name more than one node holds (``.metadata``, ``trainer.pt``, DeepSpeed's
model states) the lowest node's file is taken. The step's ``COMPLETE`` marker is
written here, last, saying ``shared``: the merged step loads on any number of ranks,
where a node's own marker would hold it to that node's ranks.

How: each node's invoker lists what may be copied, with sizes and sha256 computed
there (``invoker files``: inside the run's checkpoint or run directory only); each
file comes over the connection the CLI already holds (SFTP over SSH, a plain copy on
``localhost``; :meth:`~higgsfield.control.remote.base.Transport.get_file`). A file here of the
listed size and hash is skipped, a shorter one continues from its size (then checked
whole), and a copy whose sha256 differs is fetched again once from the start before
the pull fails with one line. On Slurm the login node is the one node: the run's
checkpoint lives in the shared workdir, written in ``shared`` mode.

A step must be complete on every node of the run: ``--step N`` that some node lacks
is a :class:`PullError` naming the nodes (exit 2), and the default is the newest step
complete on all of them.

``--hf`` then makes the merged step a Hugging Face directory, ``DEST/hf/step_XXXXXXXX``
(:func:`export_hf`): the conversion needs the whole step, which after the merge only
this machine holds (no node has another node's shards), so it runs here, in a process
of its own (:mod:`higgsfield._lib.hf_export`: the control side never imports torch).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from higgsfield.contract.codec import encode
from higgsfield.contract.errors import RunError
from higgsfield.contract.replies_disk import FilesReply
from higgsfield.contract.runstatus import RunStatus
from higgsfield.control.backends.nodes.output import decode_reply
from higgsfield.control.backends.nodes.status import find_run
from higgsfield.control.config import Config
from higgsfield.control.remote import Transport, open_group
from higgsfield.control.remote.invoker import invoker_argv

MARKER = "COMPLETE"
STEP_RE = re.compile(r"step_\d{8}")
SHA_RE = re.compile(r"[0-9a-f]{64}")
LIST_S = 600.0         # ``invoker files`` hashes every file of a step on the node: a large step takes a while
PARALLEL = 4           # files copied at once (over each node's one connection: SFTP channels side by side)
EXPORT_S = 3600.0      # converting a step to safetensors reads and writes the whole model once


class PullError(RunError):
    """A step not complete on every node, or a bad ``--step``: the user's to fix (exit 2)."""

    exit_code = 2


@dataclass(frozen=True)
class RemoteFile:
    """One file a node listed: where it is there, what it must be here."""

    node: str
    path: str          # on the node: the listing's root + rel
    rel: str           # relative, checked: no '..', no absolute path
    size: int
    sha256: str


@dataclass(frozen=True)
class Part:
    """One node of the run as the pull reaches it: its name, its transport, its invoker's argv (without a verb)."""

    name: str
    transport: Transport
    invoker: list[str]


@dataclass
class Progress:
    """Callbacks for a progress bar: the bytes to copy in all (called as files are listed), then each chunk."""

    total: Callable[[int], None] = lambda n: None
    advance: Callable[[int], None] = lambda n: None


@dataclass
class PullResult:
    dest: Path
    step: str
    nodes: list[str]
    fetched: list[str] = field(default_factory=list)    # local paths copied (whole or resumed)
    skipped: list[str] = field(default_factory=list)    # already here with the right sha256
    bytes: int = 0                                       # bytes copied over the wire
    logs: list[str] = field(default_factory=list)       # local paths of the logs brought


async def pull(cfg: Config, target: str, dest: Path | None = None, *, step: str | int | None = None,
               logs: bool = False, progress: Progress | None = None) -> PullResult:
    """Bring ``target``'s checkpoint step (default: the newest complete everywhere) to ``dest``; see the module.

    The SSH nodes' pull; a Slurm cluster's is :func:`higgsfield.control.backends.slurm.pull.pull`, and
    :func:`higgsfield.control.backends.select.pull` picks between them.
    """
    progress = progress or Progress()
    async with open_group(cfg) as group:
        status = await find_run(group, cfg, target)
        by_name = {m.name: m for m in group.members}
        parts = [Part(n, by_name[n].transport, invoker_argv(cfg, by_name[n].node))
                 for n in status.nodes if n in by_name]
        missing = [n for n in status.nodes if n not in by_name]
        if missing:
            raise PullError(f"run '{status.run}' ran on {', '.join(missing)}, not in higgsfield.yml any more")
        return await pull_parts(status, parts, dest, step, logs, progress)


async def pull_parts(status: RunStatus, parts: Sequence[Part], dest: Path | None, step: str | int | None, logs: bool,
                progress: Progress) -> PullResult:
    dest = dest or Path("pulled") / status.run
    listed = await asyncio.gather(*(_list(p, status, ["--project", status.project]) for p in parts))
    name = choose_step(status.run, [(p.name, r.steps) for p, r in zip(parts, listed, strict=True)], step)
    steps = await asyncio.gather(*(_list(p, status, ["--project", status.project, "--step", name]) for p in parts))
    files = merge_parts([_files(p.name, r) for p, r in zip(parts, steps, strict=True)])
    result = PullResult(dest, name, [p.name for p in parts])
    (dest / name / MARKER).unlink(missing_ok=True)   # the step here is whole again only once every file is
    jobs = [(parts_by(parts, f.node), f, dest / f.rel) for f in files]
    if logs:
        logs_listed = await asyncio.gather(*(_list(p, status, ["--project", status.project, "--logs"])
                                             for p in parts))
        for p, r in zip(parts, logs_listed, strict=True):
            for f in _files(p.name, r):
                local = dest / "logs" / p.name / f.rel
                jobs.append((p, f, local))
                result.logs.append(str(local))
    progress.total(sum(f.size for _, f, _ in jobs))
    limit = asyncio.Semaphore(PARALLEL)

    async def one(p: Part, f: RemoteFile, local: Path) -> None:
        async with limit:
            copied = await fetch(p.transport, f, local, progress.advance)
        (result.fetched if copied is not None else result.skipped).append(str(local))
        result.bytes += copied or 0

    await asyncio.gather(*(one(p, f, local) for p, f, local in jobs))
    write_marker(dest / name, steps[0].marker or {}, status.run, [p.name for p in parts])
    return result


def parts_by(parts: Sequence[Part], node: str) -> Part:
    return next(p for p in parts if p.name == node)


async def _list(p: Part, status: RunStatus, args: list[str]) -> FilesReply:
    """``invoker files`` on one node; its reply, decoded (the run not there: one line)."""
    res = await p.transport.run([*p.invoker, "files", *args, "--run", status.run], timeout=LIST_S)
    return decode_reply(p.name, res.stdout, FilesReply)


def choose_step(run: str, per_node: Sequence[tuple[str, object]], step: str | int | None) -> str:
    """The step to pull: ``step`` (a number, ``step_XXXXXXXX`` or ``latest``/None: the newest complete on
    every node); PullError naming the nodes that lack it."""
    held = {node: {s for s in (steps if isinstance(steps, list) else []) if isinstance(s, str) and STEP_RE.fullmatch(s)}
            for node, steps in per_node}
    if step is None or step == "latest":
        common = set.intersection(*held.values()) if held else set()
        if not common:
            where = "; ".join(f"{n}: {', '.join(sorted(s)[-3:]) or 'none'}" for n, s in held.items())
            raise PullError(f"run '{run}' has no checkpoint complete on every node ({where})")
        return max(common)
    name = step_name(step)
    lacking = [n for n, s in held.items() if name not in s]
    if lacking:
        raise PullError(f"checkpoint {name} of run '{run}' is not complete on {', '.join(lacking)} "
                        f"(complete everywhere: {', '.join(sorted(set.intersection(*held.values()))) or 'none'})")
    return name


def step_name(step: str | int) -> str:
    """``12``, ``"12"`` or ``"step_00000012"`` as ``step_00000012``; PullError for anything else."""
    text = str(step)
    if STEP_RE.fullmatch(text):
        return text
    if text.isdigit() and len(text) <= 8:
        return f"step_{int(text):08d}"
    raise PullError(f"--step {text!r}: give a step number, step_XXXXXXXX or 'latest'")


def _files(node: str, reply: FilesReply) -> list[RemoteFile]:
    """The listing's files, each checked (what comes back from a node is untrusted: no path leaves the root;
    the sizes and digests were checked as the reply was decoded)."""
    if reply.files is None:
        raise RunError(f"{node}: unexpected invoker output: no files listed (run 'higgsfield setup' to upgrade)")
    out = []
    for f in reply.files:
        if not (safe_rel(f.path) and f.size >= 0 and SHA_RE.fullmatch(f.sha256)):
            raise RunError(f"{node}: unexpected invoker output: a bad file entry {str(encode(f))[:120]!r}")
        out.append(RemoteFile(node, f"{reply.root.rstrip('/')}/{f.path}", f.path, f.size, f.sha256))
    return out


def safe_rel(rel: str) -> bool:
    """A relative path of plain names: no '..', '.', empty part, backslash or control character."""
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and all(
        p not in ("", ".", "..") and "\\" not in p and p.isprintable() for p in parts)


def merge_parts(per_node: Sequence[list[RemoteFile]]) -> list[RemoteFile]:
    """Every node's files in one list: for a name several nodes hold, the first node's (node 0's ``.metadata``)."""
    merged: dict[str, RemoteFile] = {}
    for files in per_node:
        for f in files:
            merged.setdefault(f.rel, f)
    return sorted(merged.values(), key=lambda f: f.rel)


async def fetch(t: Transport, f: RemoteFile, local: Path, advance: Callable[[int], None]) -> int | None:
    """Make ``local`` the file ``f``: None when it is already, else the bytes copied (resumed where it stopped;
    fetched again once from the start when its sha256 is wrong, then a RunError in one line)."""
    local.parent.mkdir(parents=True, exist_ok=True)
    if local.is_symlink():
        local.unlink()
    here = local.is_file()
    have = local.stat().st_size if here else 0
    if here and have == f.size and await _sha256(local) == f.sha256:
        advance(f.size)
        return None
    offset = have if have < f.size else 0
    advance(offset)
    copied = 0
    for _ in range(2):
        await t.get_file(f.path, str(local), offset=offset, end=f.size, progress=advance)
        copied += f.size - offset
        got = await _sha256(local)
        if got == f.sha256:
            return copied
        offset = 0
    raise RunError(f"{f.node}: {f.rel}: sha256 {got[:16]} after copying it twice, the node listed "
                   f"{f.sha256[:16]}: is the file still being written?")


async def _sha256(path: Path) -> str:
    def digest() -> str:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return h.hexdigest()

    return await asyncio.to_thread(digest)


def write_marker(step_dir: Path, node0: dict[str, Any], run: str, nodes: list[str]) -> None:
    """The merged step's ``COMPLETE``, written last: node 0's marker in ``shared`` mode (it loads on any ranks)."""
    marker = {k: v for k, v in node0.items() if k not in ("node", "ranks")}
    marker.update({"mode": "shared", "pulled": {"run": run, "nodes": nodes}})
    step_dir.mkdir(parents=True, exist_ok=True)
    tmp = step_dir / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(marker, sort_keys=True) + "\n")
    tmp.replace(step_dir / MARKER)


def export_hf(step_dir: Path, out: Path) -> Path:
    """Convert a pulled (merged) step to a ``transformers`` directory at ``out``, in a process of its own.

    The converter's one-line errors (no Hugging Face config, torch missing here) come back as
    a :class:`PullError`, exit 2: the step itself stays pulled, whole, beside it.
    """
    try:
        r = subprocess.run([sys.executable, "-m", "higgsfield._lib.hf_export", str(step_dir), str(out)],  # noqa: S603
                           capture_output=True, text=True, timeout=EXPORT_S)
    except subprocess.TimeoutExpired:
        raise PullError(f"converting {step_dir} to Hugging Face took over {EXPORT_S:.0f}s; the step is pulled, "
                        f"run 'python -m higgsfield._lib.hf_export {step_dir} {out}' to try again") from None
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        said = lines[-1].removeprefix("higgsfield: ") if lines else f"exit {r.returncode}"
        raise PullError(f"{said} (the step itself is pulled: {step_dir})")
    return out

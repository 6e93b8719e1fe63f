"""A checkpoint mirror: each node's part uploaded in the background, a step marked whole only when every part is up.

Used by :class:`higgsfield.checkpoint.Checkpoint` (``mirror=`` or ``checkpoint.mirror`` in
higgsfield.yml, which reaches the run as ``HIGGSFIELD_CHECKPOINT_MIRROR``). Its own module because
it is one concept (a remote copy, its markers and its upload thread) and would take
checkpoint.py far past the size one can read in a sitting.

Layout under ``<URL>/<project>/<experiment>/<run>/``::

    step_00000008/COMPLETE                 {"token", "parts": [[ranks of part 0], ...], "world_size", ...}
    step_00000008/<token>/part<N>/...      node N's files (its .distcp, .metadata, trainer.pt, rng_rank<r>.pt)
    step_00000008/<token>/part<N>.done     {"files": {name: size}, "marker": node N's own COMPLETE}

Why it is safe to kill at any moment: a part's ``.done`` is written only after
all of that part's files, and the step's ``COMPLETE`` only by a node that sees
every part's ``.done`` of the same save (``token``: one random word per save,
agreed by the ranks), so a ``COMPLETE`` always names parts that are whole. A save
killed mid-upload leaves its token's files without ``COMPLETE`` (a later save of
the same step uses another token, so old and new parts never mix); the next
``COMPLETE`` of that step or keep-last-k removes them. Markers are written
whole: one PUT on an object store, a temporary name and a rename on a path.

At most one upload is in flight per node, plus one waiting; a newer save
replaces the waiting one (the newest wins), so training never waits for the
mirror and uploads never pile up: a slow mirror holds fewer steps, never a queue
of stale ones. The thread is not a daemon, so the end of training (the process
exiting) waits for the last upload; :meth:`Uploader.join` waits on purpose.

Why fsspec directly and not DCP's own ``FsspecWriter``/``FsspecReader``: saves
stay on local disk (fast, the stall is the local write only) and the upload is a
plain copy of finished files that runs behind training; writing DCP straight to
the mirror would put the network in the save's critical path, and DCP's fsspec
writer has no notion of "every node's part is up". Reading goes through the
local directory too (download, then the normal load), so one load path is tested.

S3 credentials come from the run's secrets (``AWS_ACCESS_KEY_ID``...), and an
endpoint (MinIO, moto) from fsspec's own environment config:
``FSSPEC_S3_ENDPOINT_URL`` (s3fs takes it as ``endpoint_url``).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from higgsfield.contract.layout import CHECKPOINT_MIRROR_VAR

__all__ = ["Mirror", "Part", "Uploader", "mirror_root", "new_token", "open_mirror", "parts_to_fetch"]

MARKER = "COMPLETE"
_PREFIX = "step_"


def new_token() -> str:
    return secrets.token_hex(6)


def mirror_root(url: str, project: str, experiment: str, run: str) -> str:
    """The run's place on the mirror: ``<URL>/<project>/<experiment>/<run>``."""
    return f"{url.rstrip('/')}/{project}/{experiment}/{run}"


def open_mirror(url: str | None, project: str | None, experiment: str | None, run: str | None) -> Mirror | None:
    """The run's mirror, or None (``url`` None: ``HIGGSFIELD_CHECKPOINT_MIRROR``); reads the environment now."""
    url = os.environ.get(CHECKPOINT_MIRROR_VAR, "") if url is None else url
    if not url:
        return None
    names = [project or os.environ.get("PROJECT_NAME") or "default",
             experiment or os.environ.get("EXPERIMENT_NAME") or "default", run or os.environ.get("RUN_NAME") or "default"]
    return Mirror(mirror_root(url, *names))


def parts_to_fetch(marker: dict[str, Any], shared: bool, world_size: int, node_ranks: list[list[int]],
                   node: int) -> list[int]:
    """This node's own part when the mirror's step was saved on these nodes (``node_ranks``: node -> its ranks),
    else every part: all of them in one place load on any number of ranks."""
    parts = marker.get("parts") or []
    if shared:
        same = len(parts) == 1 and marker.get("mode") == "shared" and marker.get("world_size") == world_size
        return [0] if same else list(range(len(parts)))
    same = marker.get("world_size") == world_size and parts == node_ranks
    return [node] if same else list(range(len(parts)))


@dataclass(frozen=True)
class Part:
    """One node's part of one save, to upload."""

    step: int
    local: Path            # the node's complete step directory
    index: int             # the part's number (the node index; 0 in shared mode)
    nparts: int
    token: str
    keep_last: int | None


class Mirror:
    """The run's directory on one fsspec URL (opened lazily: constructing it touches nothing)."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self._fs: Any = None
        self._path = ""

    def _open(self) -> tuple[Any, str]:
        if self._fs is None:
            try:
                import fsspec
            except ImportError:
                raise RuntimeError("a checkpoint mirror needs fsspec: reinstall higgsfield from its repository with the 'mirror' extra (README: Install)") from None
            self._fs, self._path = fsspec.core.url_to_fs(self.root)
            self._path = self._path.rstrip("/")
        return self._fs, self._path

    @property
    def _local(self) -> bool:
        fs, _ = self._open()
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        return protocol in ("file", "local")

    def _step_dir(self, step: int) -> str:
        return f"{self._open()[1]}/{_PREFIX}{step:08d}"

    # -- upload -----------------------------------------------------------------------------

    def upload(self, part: Part) -> bool:
        """Put one node's part, then its ``.done``; mark the step if every part is there. True if marked now."""
        fs, _ = self._open()
        step_dir = self._step_dir(part.step)
        if self._read_json(f"{step_dir}/{MARKER}") is not None:
            return False  # this step is already whole on the mirror (a re-save): never mix parts of two saves
        base = f"{step_dir}/{part.token}"
        files: dict[str, int] = {}
        for path in sorted(p for p in part.local.rglob("*") if p.is_file() and p.name != MARKER):
            rel = path.relative_to(part.local).as_posix()
            target = f"{base}/part{part.index}/{rel}"
            if self._local:
                fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            fs.put_file(str(path), target)
            files[rel] = path.stat().st_size
        marker = json.loads((part.local / MARKER).read_text())
        self._write_json(f"{base}/part{part.index}.done", {"files": files, "marker": marker})
        dones = self._dones(base, part.nparts)
        if dones is None:
            return False
        ranks = [d["marker"].get("ranks") for d in dones]
        self._write_json(f"{step_dir}/{MARKER}", {
            "step": part.step, "token": part.token, "parts": ranks, "world_size": marker.get("world_size"),
            "engine": marker.get("engine"), "mode": marker.get("mode")})
        self._prune(part.step, part.token, part.keep_last)
        return True

    def _dones(self, base: str, nparts: int) -> list[dict[str, Any]] | None:
        """Every part's ``.done`` of this save, in part order; None while one is missing."""
        fs, _ = self._open()
        fs.invalidate_cache(base)  # s3fs caches listings: another node's marker must be seen now
        out = []
        for n in range(nparts):
            done = self._read_json(f"{base}/part{n}.done")
            if done is None:
                return None
            out.append(done)
        return out

    def _prune(self, step: int, token: str, keep_last: int | None) -> None:
        """After ``step`` is whole: drop its other saves' files, and steps older than the newest ``keep_last``."""
        fs, _ = self._open()
        step_dir = self._step_dir(step)
        for entry in self._ls(step_dir):
            name = entry.rsplit("/", 1)[-1]
            if name not in (token, MARKER):
                _rm(fs, entry)
        if keep_last is None:
            return
        whole = self.complete_steps()
        if len(whole) <= keep_last:
            return
        oldest_kept = whole[-keep_last]
        for s in self.steps():
            if s < oldest_kept:
                _rm(fs, self._step_dir(s))

    # -- listing and download ---------------------------------------------------------------

    def steps(self) -> list[int]:
        """Every step directory on the mirror, whole or not, oldest first."""
        names = [e.rstrip("/").rsplit("/", 1)[-1] for e in self._ls(self._open()[1])]
        return sorted(int(n[len(_PREFIX):]) for n in names if n.startswith(_PREFIX) and n[len(_PREFIX):].isdigit())

    def complete_steps(self) -> list[int]:
        return [s for s in self.steps() if self.marker(s) is not None]

    def newest(self) -> tuple[int, dict[str, Any]] | None:
        """The newest step whole on the mirror and its marker, or None."""
        for s in reversed(self.steps()):
            m = self.marker(s)
            if m is not None:
                return s, m
        return None

    def marker(self, step: int) -> dict[str, Any] | None:
        m = self._read_json(f"{self._step_dir(step)}/{MARKER}")
        return m if isinstance(m, dict) and isinstance(m.get("token"), str) and isinstance(m.get("parts"), list) \
            else None

    def download(self, step: int, marker: dict[str, Any], parts: list[int], dest: Path) -> None:
        """Fetch ``parts`` of a whole step into ``dest`` (made here). With one part the node's own marker
        comes too; with several (a topology change) the first part's metadata and trainer state serve all."""
        fs, _ = self._open()
        base = f"{self._step_dir(step)}/{marker['token']}"
        dest.mkdir(parents=True)
        for n in reversed(parts):  # the first part last: its .metadata and trainer.pt win
            done = self._read_json(f"{base}/part{n}.done")
            if not isinstance(done, dict) or not isinstance(done.get("files"), dict):
                raise FileNotFoundError(f"{base}/part{n}.done is missing on the mirror")
            for rel in done["files"]:
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(f"{base}/part{n}/{rel}", str(target))
            if len(parts) == 1:
                (dest / MARKER).write_text(json.dumps(done["marker"]))
        if len(parts) > 1:  # no node's marker fits: say it is a whole checkpoint in one place
            (dest / MARKER).write_text(json.dumps({"step": step, "mode": "mirror", "world_size":
                                                   marker.get("world_size"), "engine": marker.get("engine")}))

    # -- small helpers ----------------------------------------------------------------------

    def _ls(self, path: str) -> list[str]:
        fs, _ = self._open()
        fs.invalidate_cache(path)
        try:
            return [str(e) for e in fs.ls(path, detail=False)]
        except FileNotFoundError:
            return []

    def _read_json(self, path: str) -> Any:
        fs, _ = self._open()
        try:
            return json.loads(fs.cat_file(path))
        except FileNotFoundError:
            return None
        except ValueError:  # half a marker cannot be one: it never counts
            return None

    def _write_json(self, path: str, obj: Any) -> None:
        """A marker, written whole: a single PUT, or on a path a temporary name and a rename."""
        fs, _ = self._open()
        data = json.dumps(obj).encode()
        if not self._local:
            fs.pipe_file(path, data)
            return
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        tmp = f"{path}.part-{new_token()}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def _rm(fs: Any, path: str) -> None:
    """Remove a tree; another node pruning the same one at once is no error (the next prune finishes it)."""
    try:
        fs.rm(path, recursive=True)
    except OSError:
        pass


class Uploader:
    """One node's upload thread: one part in flight and one waiting at most, the newest waiting part winning."""

    def __init__(self, mirror: Mirror, label: str) -> None:
        self.mirror, self.label = mirror, label
        self._lock = threading.Lock()
        self._next: Part | None = None
        self._busy: Part | None = None
        self._thread: threading.Thread | None = None

    def submit(self, part: Part) -> None:
        """Queue ``part`` (replacing a waiting older one) and return at once."""
        with self._lock:
            self._next = part
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="higgsfield-mirror", daemon=False)
                self._thread.start()

    def steps(self) -> set[int]:
        """The steps being uploaded or waiting: their local directories must stay until then."""
        with self._lock:
            return {p.step for p in (self._busy, self._next) if p is not None}

    def join(self, timeout: float | None = None) -> None:
        """Wait for the uploads in flight and waiting (the end of training)."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                part, self._next = self._next, None
                self._busy = part
                if part is None:
                    self._thread = None
                    return
            try:
                self.mirror.upload(part)
            except Exception as e:  # noqa: BLE001 - a failed upload is a warning; training goes on
                print(f"higgsfield: checkpoint mirror: upload of {self.label}'s part of {_PREFIX}{part.step:08d} "
                      f"to {self.mirror.root} failed ({type(e).__name__}: {_one_line(e)}); training goes on, the "
                      "mirror has no COMPLETE for that step", file=sys.stderr, flush=True)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]

"""Sharded checkpoints that resume, also onto another number of GPUs.

::

    ckpt = Checkpoint(model, optimizer, scheduler, scaler, every=100, keep_last=2)
    start = ckpt.load_latest(loader)          # 0 on a fresh run
    for step, batch in loader.iterate(start, max_steps=5000):
        ...
        ckpt.maybe_save(step, loader)         # after steps 99, 199, ...: resume at 100, 200, ...

That is all the resume code an experiment needs: ``higgsfield run`` (or
torchrun's ``--max-restarts``) restarting the same run finds the last complete
checkpoint in the run's directory and continues from there.

Where: ``~/.cache/higgsfield/<project>/experiments/<experiment>/<run>/``, the
names taken from the arguments or, at construction (never at import), from
``PROJECT_NAME``, ``EXPERIMENT_NAME`` and ``RUN_NAME``; ``HIGGSFIELD_CHECKPOINT_DIR``
or ``directory=`` names the run's directory outright.

Two modes, found by themselves at the first save or load (a collective): rank 0
writes a probe file into the directory and every rank looks for it.

- **shared**: every rank sees the probe (one node, or a filesystem the nodes
  share). One directory holds the whole checkpoint; rank 0 writes the marker.
- **node-local**: some rank does not (boxes that share no disk: each node's
  directory is its own). Each node keeps its part in its own directory, written
  by that node's lowest rank (its *lead*) and its ranks, and a load on the same
  nodes reads only its own node's files, so a torchrun restart or ``run`` reusing
  the name resumes with no copying.

Layout and why::

    <run dir>/step_00000100/          model + optimizer shards (torch.distributed.checkpoint),
        .metadata  __0_0.distcp ...   trainer.pt (scheduler, scaler, step, loader), rng_rank<r>.pt,
        hf/                           config.json + tokenizer, by rank 0 (:mod:`higgsfield._lib.hf_meta`)
        COMPLETE                      written last
    <run dir>/.tmp-step_00000200/     a save in progress (or a crashed one): never loaded

In node-local mode each node's ``step_*`` holds the ``.distcp`` files of its
own ranks, its own ``.metadata``, ``trainer.pt``, the rng files of its ranks and
its own ``COMPLETE`` (which records the mode, the world size and the node's
ranks). Why the metadata differs per node: DCP de-duplicates what every rank
holds alike (plain tensors such as AdamW's ``step``, and pickled values such as
param groups) to one rank's file, so a node holding only its own files would
miss them. Here each node's lead writes its own copy of those items
(``_NodeLocalPlanner``), and rank 0, which gathers every rank's write results,
writes one ``.metadata`` per node in which those items point at that node's
copy (``_NodeLocalWriter``); it sends each node's bytes to the node's lead over
the default group. The sharded tensors keep one global list of chunks (with the
files named by global rank), so every node's ``.metadata`` is a valid global one:
the parts of all nodes put in one directory (a mirror, a pull) load on any
number of ranks. Writing per-node DCP checkpoints on node subgroups would have
been simpler, but their files collide by name and no single metadata describes
the whole model.

A checkpoint is complete only when it is complete on every node: the save's
last phase (each lead's marker and rename) ends with the ranks agreeing on it,
and ``load_latest`` loads the newest step every node holds complete (each node
proposes its complete steps; the newest one in all of them wins). A node that
lacks it (a node replaced, other nodes) is named in one line, as a
:class:`CheckpointError` on every rank. Keep-last-k prunes on every node, by the
steps complete everywhere, and only after a newer save is complete.

A **mirror** (``mirror=`` or ``HIGGSFIELD_CHECKPOINT_MIRROR``, any fsspec URL;
:mod:`higgsfield._lib.ckpt_mirror`) gets each node's part after every complete save:
the node's lead hands it to an upload thread and training goes on, and the step
counts there only once every node's part is up. ``load_latest`` asks it (rank 0
reads, every rank learns the answer) when no step is complete on every node or
it holds a newer one (a node's part saved on other nodes or another world size
does not count as here: it cannot load on this topology): each node's lead
downloads what its node lacks (its own part on the same nodes; every part on
other nodes or another world size, since every part's metadata is a global one),
the ranks agree, and the load is the normal one from the local directory.

A save is written to ``.tmp-step_*`` and renamed once every rank has finished
and the ``COMPLETE`` marker is on disk, so a crash mid-save leaves nothing that
looks whole. DCP stores each tensor with its global shape, so a checkpoint
written by N ranks loads on M (in node-local mode: once the parts are in one
place). DeepSpeed uses its own format (same world size only; convert with
``python -m deepspeed.checkpoint.ds_to_universal`` to change it); in node-local
mode each node's lead also writes DeepSpeed's model-states file, which every
rank's load reads, and each rank its own ZeRO partition.

A save that fails (a full disk, a quota, a rank that cannot write) raises
:class:`CheckpointError` on every rank at the same point, never on one rank only
while the others wait in a collective: each phase of a save ends with the ranks
agreeing on whether it worked. Its partial directory is removed at once (it holds
the space a full disk needs back), the complete checkpoints are left as they
were, and keep-last-k only ever prunes after a newer checkpoint is complete, so
the last good one is never deleted because a newer one failed. Leftovers of a
save that was killed (``.tmp-*``) are removed before the next save writes, for
the same reason. Catching the error on every rank and training on is safe.

One concept, the save/load pair and what "complete" means across ranks and nodes, so one
public module (over 800 lines); the mirror's uploads live in :mod:`higgsfield._lib.ckpt_mirror`.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import random
import secrets
import shutil
import socket
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from higgsfield._lib.ckpt_mirror import Part, Uploader, new_token, open_mirror, parts_to_fetch
from higgsfield._lib.hf_meta import HF_DIR, write_hf_meta
from higgsfield.contract.errors import CheckpointError
from higgsfield.contract.layout import CHECKPOINT_DIR_VAR, NODE_VAR

__all__ = ["Checkpoint", "CheckpointError", "checkpoint_dir", "MARKER"]

MARKER = "COMPLETE"
_PREFIX = "step_"
_TMP = ".tmp-"
_PROBE = ".probe-"


@dataclass(frozen=True)
class _Layout:
    """Where the ranks are: found once per :class:`Checkpoint` by a collective (see the module docstring)."""

    shared: bool
    node_of: tuple[int, ...]  # global rank -> node index (nodes numbered by their lowest rank)
    names: tuple[str, ...]    # node index -> its name (HIGGSFIELD_NODE, else the host name)
    dirs: tuple[str, ...]     # node index -> the checkpoint directory there

    def ranks(self, node: int) -> list[int]:
        return [r for r, n in enumerate(self.node_of) if n == node]

    def lead(self, rank: int) -> bool:
        """Does ``rank`` write its node's files (the marker, trainer.pt)? Rank 0 alone on a shared disk."""
        if self.shared:
            return rank == 0
        return rank == min(self.ranks(self.node_of[rank]))


def checkpoint_dir(project: str | None = None, experiment: str | None = None, run: str | None = None,
                   env: dict[str, str] | None = None) -> Path:
    """The run's checkpoint directory (see the module docstring); reads ``env`` (os.environ) now."""
    env = dict(os.environ) if env is None else env
    if env.get(CHECKPOINT_DIR_VAR) and not (project or experiment or run):
        return Path(env[CHECKPOINT_DIR_VAR]).expanduser()
    project = project or env.get("PROJECT_NAME") or "default"
    experiment = experiment or env.get("EXPERIMENT_NAME") or "default"
    run = run or env.get("RUN_NAME") or "default"
    return Path.home() / ".cache" / "higgsfield" / project / "experiments" / experiment / run


class Checkpoint:
    """Save and restore model, optimizer, scheduler, scaler, RNG and step as one unit.

    ``every``: save after each ``every`` steps in :meth:`maybe_save`. ``keep_last``:
    complete checkpoints kept (older ones are deleted; None keeps all).
    ``async_save``: write in the background (own gloo group) while training goes on.
    ``mirror``: an fsspec URL (``s3://bucket/prefix``, ``gs://``, ``sftp://``, a path) that each node's
    part is uploaded to after every complete save, in the background; default ``HIGGSFIELD_CHECKPOINT_MIRROR``
    (``checkpoint.mirror`` in higgsfield.yml), ``""`` for none. See :mod:`higgsfield._lib.ckpt_mirror`.
    ``tokenizer``: saved into each step's ``hf/`` with the model's config (default: the loader's ``tokenizer``).
    """

    def __init__(self, model: Any, optimizer: torch.optim.Optimizer, lr_scheduler: Any = None, scaler: Any = None,
                 every: int = 100, keep_last: int | None = 2, directory: str | os.PathLike[str] | None = None,
                 project: str | None = None, experiment: str | None = None, run: str | None = None,
                 async_save: bool = False, mirror: str | None = None, tokenizer: Any = None) -> None:
        if every < 1:
            raise ValueError(f"Checkpoint: every must be at least 1, got {every}")
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"Checkpoint: keep_last must be at least 1 or None, got {keep_last}")
        if getattr(model, "precision", None) == "fp16" and getattr(model, "engine", "fsdp") == "fsdp" \
                and scaler is None:
            raise ValueError("Checkpoint: precision='fp16' trains with a loss scaler; pass scaler= so its "
                             "scale is saved and restored")
        self.model, self.optimizer, self.lr_scheduler, self.scaler = model, optimizer, lr_scheduler, scaler
        self.every, self.keep_last, self.async_save, self.tokenizer = every, keep_last, async_save, tokenizer
        self.directory = Path(directory).expanduser() if directory else checkpoint_dir(project, experiment, run)
        self._pending: tuple[Any, Path, Path, Any] | None = None
        self._async_group: Any = None
        self._layout_cache: _Layout | None = None
        self._mirror = open_mirror(mirror, project, experiment, run)
        self._uploader: Uploader | None = None

    # -- listing ------------------------------------------------------------------------------

    def complete(self) -> list[Path]:
        """Complete checkpoints, oldest first (a directory without the marker is not one)."""
        if not self.directory.is_dir():
            return []
        found = [p for p in self.directory.iterdir()
                 if p.name.startswith(_PREFIX) and p.name[len(_PREFIX):].isdigit() and (p / MARKER).is_file()]
        return sorted(found, key=lambda p: int(p.name[len(_PREFIX):]))

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    # -- where the ranks are ------------------------------------------------------------------

    def _layout(self) -> _Layout:
        """Shared or node-local, and which rank is on which node. Collective, once.

        Shared exactly when every rank sees the probe rank 0 wrote into the
        directory; a node is a torchrun agent (``GROUP_RANK``), else a host.
        """
        if self._layout_cache is not None:
            return self._layout_cache
        rank = dist.get_rank()
        token = [secrets.token_hex(8) if rank == 0 else None]
        probe = None
        if rank == 0:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                probe = self.directory / f"{_PROBE}{token[0]}"
                probe.write_text("")
            except OSError:
                probe = None  # nobody sees it: node-local, and the save reports the directory's error
        dist.broadcast_object_list(token, src=0)
        seen = (self.directory / f"{_PROBE}{token[0]}").is_file()
        node_key = os.environ.get("GROUP_RANK") or socket.gethostname()
        name = os.environ.get(NODE_VAR) or socket.gethostname()
        mine = (seen, node_key, name, str(self.directory))
        infos: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(infos, mine)  # every rank has looked before anyone removes the probe
        if probe is not None:
            probe.unlink(missing_ok=True)
        order: dict[str, int] = {}
        for _, key, _, _ in infos:
            order.setdefault(key, len(order))
        node_of = tuple(order[key] for _, key, _, _ in infos)
        first = [node_of.index(n) for n in range(len(order))]
        self._layout_cache = _Layout(shared=all(i[0] for i in infos), node_of=node_of,
                                     names=tuple(infos[r][2] for r in first),
                                     dirs=tuple(infos[r][3] for r in first))
        return self._layout_cache

    def _agreed_steps(self, layout: _Layout) -> tuple[dict[int, set[int]], dict[int, set[int]]]:
        """node -> its complete steps, and node -> those of them saved on another topology (a node-local
        part whose ranks are not this node's now), as each node's lead sees them. Collective."""
        rank = dist.get_rank()
        mine = None
        if layout.lead(rank):
            done = self.complete()
            mine = ([_step_of(p) for p in done], [_step_of(p) for p in done if _misfit(p, layout) is not None])
        props: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(props, mine)
        held = {layout.node_of[r]: set(p[0]) for r, p in enumerate(props) if p is not None}
        foreign = {layout.node_of[r]: set(p[1]) for r, p in enumerate(props) if p is not None}
        return held, foreign

    # -- save ---------------------------------------------------------------------------------

    def maybe_save(self, step: int, loader: Any = None) -> bool:
        """Save after step ``step`` (0-based) when ``step + 1`` is a multiple of ``every``."""
        if (step + 1) % self.every:
            return False
        self.save(step, loader)
        return True

    def save(self, step: int, loader: Any = None) -> Path:
        """Save the state after step ``step``; a resume continues at ``step + 1``. Collective.

        Raises :class:`CheckpointError` on every rank when any rank fails to write;
        the partial save is removed and the complete checkpoints stay as they were.
        """
        self.wait()
        next_step = step + 1
        final = self.directory / f"{_PREFIX}{next_step:08d}"
        tmp = self.directory / f"{_TMP}{final.name}"
        rank = dist.get_rank()
        what = f"save of {final.name}"
        layout = self._layout()
        lead = layout.lead(rank)

        def prepare() -> None:
            if lead:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._remove_partial()  # a killed save's leftovers hold space this one may need
                tmp.mkdir()

        self._agree(what, _attempt(prepare, tmp), tmp)

        def write_local() -> None:  # no collective in here: a rank that fails must not strand the others
            if not tmp.is_dir():
                raise FileNotFoundError(f"{tmp} made by this node's first rank is not visible here")
            _write_small(_rng_state(), tmp / f"rng_rank{rank}.pt")
            if lead:
                _write_small(self._trainer_state(next_step, loader), tmp / "trainer.pt")
            if rank == 0:
                write_hf_meta(self.model, self.tokenizer or getattr(loader, "tokenizer", None), tmp / HF_DIR)

        self._agree(what, _attempt(write_local, tmp), tmp)
        future: Any = None
        writer: Any = None

        def write_weights() -> None:  # collective; DCP agrees across ranks by itself
            nonlocal future, writer
            future, writer = self._save_weights(tmp, layout)

        self._agree(what, _attempt(write_weights, tmp), tmp)
        self._pending = (future, tmp, final, writer)
        if future is None:
            self.wait()
        return final

    def wait(self) -> None:
        """Finish a save in flight: every rank's shards are on disk, then mark and rename. Collective.

        An asynchronous save's failure surfaces here (on every rank, as :class:`CheckpointError`).
        """
        if self._pending is None:
            return
        future, tmp, final, writer = self._pending
        self._pending = None
        what = f"save of {final.name}"
        layout = self._layout()
        lead = layout.lead(dist.get_rank())
        if future is not None:
            self._agree(what, _attempt(future.result, tmp), tmp)
        if not layout.shared and getattr(self.model, "engine", "fsdp") != "deepspeed":
            self._spread_metadata(what, tmp, layout, writer)
        self._agree(what, _attempt(lambda: self._finish(tmp, final, layout), tmp) if lead else None, tmp)
        token = self._mirror_token()
        self._prune(layout)  # only now, with the new checkpoint complete on every node
        dist.barrier()
        if token is not None and lead:
            self._upload(final, layout, token)

    def wait_uploads(self, timeout: float | None = None) -> None:
        """Wait for this node's mirror uploads in flight (the process's exit waits for them anyway)."""
        if self._uploader is not None:
            self._uploader.join(timeout)

    def _mirror_token(self) -> str | None:
        """One random word per save, the same on every rank: a mirror never mixes parts of two saves. Collective."""
        if self._mirror is None:
            return None
        token = [new_token() if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(token, src=0)
        return token[0]

    def _upload(self, final: Path, layout: _Layout, token: str) -> None:
        """Hand this node's part to the upload thread (a node's lead only); returns at once."""
        assert self._mirror is not None
        node = 0 if layout.shared else layout.node_of[dist.get_rank()]
        if self._uploader is None:
            self._uploader = Uploader(self._mirror, "this node" if layout.shared else f"node {layout.names[node]}")
        self._uploader.submit(Part(step=_step_of(final), local=final, index=node,
                                   nparts=1 if layout.shared else len(layout.names), token=token,
                                   keep_last=self.keep_last))

    def _spread_metadata(self, what: str, tmp: Path, layout: _Layout, writer: Any) -> None:
        """Send each node's ``.metadata`` (made by rank 0) to that node's lead, which writes it. Collective."""
        blobs = [writer.per_node if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(blobs, src=0)
        rank = dist.get_rank()
        node = layout.node_of[rank]

        def write() -> None:
            if layout.lead(rank) and node != layout.node_of[0]:
                _write_bytes(blobs[0][node], tmp / ".metadata")

        self._agree(what, _attempt(write, tmp), tmp)

    def _finish(self, tmp: Path, final: Path, layout: _Layout) -> None:
        """A node's lead: write the marker (fsync'd) and rename the whole directory into place."""
        node = layout.node_of[dist.get_rank()]
        with open(tmp / MARKER, "w") as f:
            json.dump({"step": _step_of(final), "world_size": dist.get_world_size(),
                       "engine": getattr(self.model, "engine", "fsdp"), "time": time.time(),
                       "mode": "shared" if layout.shared else "node-local", "nodes": len(layout.names),
                       "node": node, "ranks": layout.ranks(node)}, f)
            f.flush()
            os.fsync(f.fileno())
        if final.exists() and _exchange(tmp, final):  # a re-save of the same step: swapped in one step
            _fsync_dir(self.directory)
            shutil.rmtree(tmp, ignore_errors=True)
            return
        aside = None
        if final.exists():  # no atomic exchange here: the old one goes aside only until the new one is in place
            aside = self.directory / f"{_TMP}old-{final.name}"
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(final, aside)
        try:
            os.rename(tmp, final)
        except OSError:
            if aside is not None:
                os.rename(aside, final)
            raise
        _fsync_dir(self.directory)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)

    def _agree(self, what: str, error: str | None, partial: Path | None = None) -> None:
        """Every rank learns whether any rank failed; if one did, all raise the same CheckpointError.

        Without this a rank that cannot write would raise alone while the others
        wait for it in the next collective until the process group times out.
        ``partial`` (a save's temporary directory) is removed on failure.
        """
        reports: list[str | None] = [None] * dist.get_world_size()
        dist.all_gather_object(reports, error)
        failures = {r: msg for r, msg in enumerate(reports) if msg}
        if not failures:
            return
        if partial is not None:
            if _local_rank() == 0:  # one rank per node: the directory may be local to each node
                shutil.rmtree(partial, ignore_errors=True)
            dist.barrier()  # nobody starts another save while the partial one is being removed
            last = self.latest()
            kept = f"; the last complete checkpoint, {last.name}, is intact" if last else \
                "; there is no earlier complete checkpoint"
        else:
            kept = ""
        raise CheckpointError(f"checkpoint {what} in {self.directory} failed: {failures[min(failures)]}{kept}",
                              failures)

    def _save_weights(self, path: Path, layout: _Layout) -> tuple[Any, Any]:
        """Write the shards; returns (the future of an async save or None, the DCP writer or None)."""
        if getattr(self.model, "engine", "fsdp") == "deepspeed":
            engine = self.model.ds_engine
            if not layout.shared and layout.lead(dist.get_rank()):
                engine.save_non_zero_checkpoint = True  # its model-states file, which every rank's load reads
            engine.save_checkpoint(str(path), tag="deepspeed", save_latest=False)
            return None, None
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(_module(self.model), self.optimizer)
        state = {"model": msd, "optim": osd}
        writer: Any = None
        kw: dict[str, Any] = {"checkpoint_id": str(path)}
        if not layout.shared:
            writer = _node_local_writer(path, layout.node_of)
            kw = {"storage_writer": writer, "planner": _node_local_planner(layout.node_of)}
        if not self.async_save:
            dcp.save(state, **kw)
            return None, writer
        if self._async_group is None:  # sharing the training group with FSDP hangs (TESTBED)
            self._async_group = dist.new_group(backend="gloo")
        return dcp.async_save(state, process_group=self._async_group, **kw), writer

    def _trainer_state(self, next_step: int, loader: Any) -> dict[str, Any]:
        return {
            "step": next_step,
            "world_size": dist.get_world_size(),
            "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "loader": loader.state_dict() if loader is not None and hasattr(loader, "state_dict") else None,
        }

    def _remove_partial(self) -> None:
        """Delete every ``.tmp-*`` but the save in flight: never loadable, and they hold disk space."""
        pending = self._pending[1] if self._pending is not None else None
        for stale in self.directory.glob(f"{_TMP}*"):
            if stale != pending:
                shutil.rmtree(stale, ignore_errors=True)

    def _prune(self, layout: _Layout) -> None:
        """Keep the newest ``keep_last`` checkpoints complete on every node; only after a save completed.

        Collective. A step complete on some nodes only goes too (the mirror keeps its own last k). The steps
        this node is still uploading stay until the upload is done.
        """
        everywhere = set.intersection(*self._agreed_steps(layout)[0].values())
        if not layout.lead(dist.get_rank()):
            return
        self._remove_partial()
        if self.keep_last is not None:
            keep = set(sorted(everywhere)[-self.keep_last:])
            keep |= self._uploader.steps() if self._uploader is not None else set()  # the mirror reads them now
            for old in self.complete():
                if _step_of(old) not in keep:
                    shutil.rmtree(old, ignore_errors=True)

    # -- load ---------------------------------------------------------------------------------

    def load_latest(self, loader: Any = None) -> int:
        """Restore the newest checkpoint complete on every node; returns the step to continue from (0 if none).

        Collective: every rank loads the same step. When some node holds none of
        the steps the others hold, every rank raises the same one-line
        :class:`CheckpointError` naming it.
        """
        layout = self._layout()
        per_node, foreign = self._agreed_steps(layout)
        if self._mirror is not None:
            # Parts saved on other nodes or another world size cannot load here; the mirror's whole step can.
            usable = {n: steps - foreign[n] for n, steps in per_node.items()}
            best = max(set.intersection(*usable.values()), default=None)
            newest = max(set.union(*usable.values()), default=None)
            if best is None or (newest is not None and newest > best):
                resumed = self._from_mirror(layout, usable, best, loader)  # newer there than here, or none here
                if resumed is not None:
                    return resumed
        everywhere = set.intersection(*per_node.values())
        newest = max(set.union(*per_node.values()), default=None)
        if everywhere:
            step = max(everywhere)
            if newest is not None and newest > step and dist.get_rank() == 0:
                print(f"higgsfield: {self._missing(newest, per_node, layout)}; resuming from "
                      f"{_PREFIX}{step:08d}, the newest checkpoint complete on every node", file=sys.stderr,
                      flush=True)
            return self.load(self.directory / f"{_PREFIX}{step:08d}", loader)
        if newest is None:
            return 0
        return self._unavailable(newest, per_node, layout, loader)

    def _unavailable(self, step: int, per_node: dict[int, set[int]], layout: _Layout, loader: Any) -> int:
        """No step is complete on every node, and the mirror (if any) held none newer than here (load_latest
        asked it first): every rank raises the same CheckpointError."""
        where = f"; the mirror {self._mirror.root} holds no complete step" if self._mirror is not None else \
            ": resume on the same nodes, or from a mirror"
        raise CheckpointError(f"{self._missing(step, per_node, layout)}{where}", {})

    def _from_mirror(self, layout: _Layout, per_node: dict[int, set[int]], newer_than: int | None,
                     loader: Any) -> int | None:
        """Load the mirror's newest complete step if it is newer than ``newer_than``; None if it holds none.

        Collective. Rank 0 reads the mirror; each node's lead downloads what its node
        lacks (its own part on the same topology, every part otherwise, since each
        part's metadata is a valid global one), the ranks agree, then the normal load.
        """
        assert self._mirror is not None
        rank = dist.get_rank()
        box: list[Any] = [None]
        if rank == 0:
            try:
                box[0] = ("ok", self._mirror.newest())
            except Exception as e:  # noqa: BLE001 - said on every rank as one line
                box[0] = ("error", f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
        dist.broadcast_object_list(box, src=0)
        kind, found = box[0]
        if kind == "error":
            raise CheckpointError(f"cannot read the checkpoint mirror {self._mirror.root}: {found}", {})
        if found is None or (newer_than is not None and found[0] <= newer_than):
            return None
        step, marker = found
        final = self.directory / f"{_PREFIX}{step:08d}"
        node = layout.node_of[rank]
        parts = parts_to_fetch(marker, layout.shared, dist.get_world_size(),
                               [layout.ranks(n) for n in range(len(layout.names))], node)
        mirror = self._mirror

        def fetch() -> None:
            if parts == [0 if layout.shared else node] and step in per_node.get(node, set()):
                return  # this node's own part is here and complete
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = self.directory / f"{_TMP}mirror-{final.name}"
            shutil.rmtree(tmp, ignore_errors=True)
            mirror.download(step, marker, parts, tmp)
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_dir(self.directory)

        self._agree(f"download of {final.name} from the mirror {mirror.root}",
                    _attempt(fetch) if layout.lead(rank) else None)
        if rank == 0:
            print(f"higgsfield: resuming from {final.name} on the checkpoint mirror {mirror.root}", file=sys.stderr,
                  flush=True)
        return self.load(final, loader)

    def _missing(self, step: int, per_node: dict[int, set[int]], layout: _Layout) -> str:
        name = f"{_PREFIX}{step:08d}"
        lacking = [f"node {n} ({layout.names[n]}: no {name} in {layout.dirs[n]})"
                   for n in sorted(per_node) if step not in per_node[n]]
        return f"checkpoint step {step} is not complete on {', '.join(lacking)}"

    def load(self, path: Path, loader: Any = None) -> int:
        """Restore one checkpoint directory; returns the step to continue from. Collective."""
        layout = self._layout()

        def check() -> None:
            if not (path / MARKER).is_file():
                raise FileNotFoundError(f"{path} is not a complete checkpoint on node "
                                        f"{layout.names[layout.node_of[dist.get_rank()]]} (no {MARKER} marker)")
            _check_topology(path, layout)

        self._agree(f"load of {path.name}", _attempt(check))
        trainer = torch.load(path / "trainer.pt", map_location="cpu", weights_only=True)
        self._load_weights(path, trainer["world_size"])
        if self.lr_scheduler is not None and trainer["lr_scheduler"] is not None:
            self.lr_scheduler.load_state_dict(trainer["lr_scheduler"])
        if self.scaler is not None and trainer["scaler"] is not None:
            self.scaler.load_state_dict(trainer["scaler"])
        rng = path / f"rng_rank{dist.get_rank()}.pt"
        _set_rng_state(torch.load(rng if rng.is_file() else path / "rng_rank0.pt", weights_only=False))
        saved = trainer.get("loader")
        if loader is not None and saved is not None:
            _check_loader(saved, loader.state_dict())
            loader.set_epoch(trainer["step"] // max(len(loader), 1))
        return int(trainer["step"])

    def _load_weights(self, path: Path, saved_world_size: int) -> None:
        if getattr(self.model, "engine", "fsdp") == "deepspeed":
            if saved_world_size != dist.get_world_size():
                raise ValueError(f"{path} was written by DeepSpeed on {saved_world_size} ranks and this run has "
                                 f"{dist.get_world_size()}: convert it with `python -m "
                                 "deepspeed.checkpoint.ds_to_universal` first, or use engine='fsdp'")
            self.model.ds_engine.load_checkpoint(str(path), tag="deepspeed", load_optimizer_states=True,
                                                 load_lr_scheduler_states=False)
            return
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        msd, osd = get_state_dict(_module(self.model), self.optimizer)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(_module(self.model), self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])


def _step_of(path: Path) -> int:
    return int(path.name[len(_PREFIX):])


def _check_topology(path: Path, layout: _Layout) -> None:
    """A node-local part loads only on the ranks that wrote it (the other nodes' files are elsewhere)."""
    misfit = _misfit(path, layout)
    if misfit is not None:
        raise ValueError(misfit)


def _misfit(path: Path, layout: _Layout) -> str | None:
    """Why the step at ``path`` cannot load on this rank's node as it is (a node-local part written by other
    ranks), or None when it can; called by the node's lead for its load_latest, by every rank for its load."""
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):  # an older or damaged marker: the checkpoint is judged by its files, as before
        marker = {}
    if not isinstance(marker, dict) or marker.get("mode") != "node-local":
        return None
    node = layout.node_of[dist.get_rank()]
    now = {"world_size": dist.get_world_size(), "nodes": len(layout.names), "ranks": layout.ranks(node)}
    then = {k: marker.get(k) for k in now}
    if then == now:
        return None
    return (f"{path} on node {layout.names[node]} is node {marker.get('node')}'s part of a checkpoint "
            f"saved on {then['nodes']} nodes ({then['world_size']} ranks, its ranks {then['ranks']}), "
            f"and this run has {now['nodes']} nodes ({now['world_size']} ranks, here {now['ranks']}): "
            "resume on the same nodes, or from a mirror")


def _node_local_planner(node_of: tuple[int, ...]) -> Any:
    """A DefaultSavePlanner that also gives each node's lowest rank its node's copy of the replicated items."""
    from torch.distributed.checkpoint import DefaultSavePlanner

    class NodeLocalPlanner(DefaultSavePlanner):
        def _create_global_plan(self, all_plans: list[Any]) -> tuple[list[Any], Any]:
            global_plan, metadata = super()._create_global_plan(all_plans)
            return _copies_per_node(all_plans, global_plan, node_of), metadata

    return NodeLocalPlanner(dedup_save_to_lowest_rank=True)


def _copies_per_node(local: list[Any], deduped: list[Any], node_of: tuple[int, ...]) -> list[Any]:
    """Add back to ``deduped`` what a node would otherwise read from another node's file.

    DCP keeps each replicated item on one rank; here the lowest rank of every
    other node that planned the item writes it too. (A ``MetadataIndex`` compares
    by name and offset only, so these copies share the index of the one in the metadata.)
    """
    held = {item.index: node_of[r] for r, plan in enumerate(deduped) for item in plan.items}
    have: dict[int, set[Any]] = {}
    for index, node in held.items():
        have.setdefault(node, set()).add(index)
    extra: list[list[Any]] = [[] for _ in local]
    for r, plan in enumerate(local):
        mine = have.setdefault(node_of[r], set())
        for item in plan.items:
            if item.index not in mine:
                mine.add(item.index)
                extra[r].append(item)
    return [dataclasses.replace(plan, items=[*plan.items, *more]) for plan, more in zip(deduped, extra, strict=True)]


def _node_local_writer(path: Path, node_of: tuple[int, ...]) -> Any:
    """A FileSystemWriter whose coordinator makes one ``.metadata`` per node (``per_node``: node -> bytes)."""
    from torch.distributed.checkpoint import FileSystemWriter

    class NodeLocalWriter(FileSystemWriter):
        per_node: dict[int, bytes]

        def finish(self, metadata: Any, results: list[list[Any]]) -> None:
            def mine_last(node: int) -> list[list[Any]]:  # a node's own copies listed last win
                ranks = sorted(range(len(results)), key=lambda r: node_of[r] == node)
                return [results[r] for r in ranks]

            super().finish(metadata, mine_last(node_of[0]))  # sets version and storage_meta in metadata
            self.per_node = {}
            for node in sorted(set(node_of) - {node_of[0]}):
                storage = {wr.index: wr.storage_data for wrs in mine_last(node) for wr in wrs}
                self.per_node[node] = pickle.dumps(dataclasses.replace(metadata, storage_data=storage))

    return NodeLocalWriter(str(path))


def _write_bytes(data: bytes, path: Path) -> None:
    """Write through a temporary name, fsync, rename: a reader never sees half a file."""
    part = path.with_name(path.name + ".part")
    with open(part, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(part, path)


def _attempt(fn: Callable[[], Any], where: Path | None = None) -> str | None:
    """Run ``fn``; None if it worked, else ``"rank R: Type: message"`` naming the rank where it failed.

    DCP already agrees across ranks and raises its CheckpointException everywhere;
    its first failure (a rank and an exception) is what is reported then. When the
    filesystem of ``where`` is (nearly) full that is said too: torch's own message
    for a full disk is "[enforce fail at inline_container.cc] unexpected pos".
    """
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        fn()
    except CheckpointException as e:
        if e.failures:
            origin = min(e.failures)
            exc = e.failures[origin][0]
            return f"rank {origin}: {type(exc).__name__}: {exc}{_full_disk(where)}"
        return f"rank {dist.get_rank()}: {e}{_full_disk(where)}"
    except Exception as e:  # noqa: BLE001 - every failure is reported to every rank, then raised
        return f"rank {dist.get_rank()}: {type(e).__name__}: {e}{_full_disk(where)}"
    return None


#: Below this much free space (or 0.5% of the filesystem) a failed write is reported as a full disk.
_FULL_BELOW = 1 << 20


def _full_disk(where: Path | None) -> str:
    """`` (the filesystem of X is full: N KiB free)`` when it is, else ``""``."""
    if where is None:
        return ""
    for p in (where, *where.parents):
        try:
            st = os.statvfs(p)
        except OSError:
            continue
        free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
        if free < max(_FULL_BELOW, total // 200):
            return f" (the filesystem of {p} is full: {free // 1024} KiB free of {total // 1024} KiB)"
        return ""
    return ""


def _write_small(obj: Any, path: Path) -> None:
    """torch.save through memory, then one plain write and fsync.

    torch.save straight to a file on a full disk fails with "[enforce fail at
    inline_container.cc] unexpected pos"; a plain write says "No space left on device".
    """
    buf = io.BytesIO()
    torch.save(obj, buf)
    with open(path, "wb") as f:
        f.write(buf.getbuffer())
        f.flush()
        os.fsync(f.fileno())


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", dist.get_rank()))


def _module(model: Any) -> torch.nn.Module:
    """The sharded HF module inside a :class:`Llama` (or a plain FSDP2 module)."""
    return getattr(model, "module", model)


def _check_loader(saved: dict[str, Any], now: dict[str, Any]) -> None:
    diff = [k for k in ("seed", "global_batch_size", "rows", "packing") if saved.get(k) != now.get(k)]
    if diff:
        warnings.warn(f"resuming with a different data setup ({', '.join(f'{k}: {saved.get(k)} -> {now.get(k)}' for k in diff)}): "
                      "the data order after the checkpoint differs from the original run", stacklevel=3)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    try:
        import numpy as np
        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if "numpy" in state:
        import numpy as np
        np.random.set_state(state["numpy"])


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

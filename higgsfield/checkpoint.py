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
ranks). Why each node has its own ``.metadata`` (every one a valid global one, so the parts of
all nodes put in one directory load on any number of ranks): :mod:`higgsfield._lib.ckpt_shards`.

A checkpoint is complete only when it is complete on every node: the save's
last phase (each lead's marker and rename) ends with the ranks agreeing on it,
and ``load_latest`` loads the newest step every node holds complete (each node
proposes its complete steps; the newest one in all of them wins). A node that
lacks it (a node replaced, other nodes) is named in one line, as a
:class:`CheckpointError` on every rank. Keep-last-k prunes on every node, by the
steps complete everywhere, and only after a newer save is complete.

**Buddy copies** (node-local mode, on by default; :mod:`higgsfield._lib.ckpt_buddy`): after each
complete save every node's part is copied to the next node of the ring over the run's own
process group, in the background, so a node that loses its disk loses no step. ``load_latest``
puts a step together from the nodes' own parts and those copies when a node lacks its part (a
spare in a lost node's place) or the run now has fewer nodes or other ranks
(:mod:`higgsfield._lib.ckpt_resume` chooses: own parts, then copies, then the mirror).

A **mirror** (``mirror=`` or ``HIGGSFIELD_CHECKPOINT_MIRROR``, any fsspec URL;
:mod:`higgsfield._lib.ckpt_mirror`) gets each node's part after every complete save:
the node's lead hands it to an upload thread and training goes on, and the step
counts there only once every node's part is up. ``load_latest`` asks it
when no step is complete on every node or it holds a newer one: each node's lead
downloads what its node lacks (:mod:`higgsfield._lib.ckpt_from_mirror`), the ranks
agree, and the load is the normal one from the local directory.

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

The RNG files are plain data, loaded with ``weights_only=True``: a pickle in one (an
older checkpoint's, or one planted on a mirror) is never unpickled; that rank resumes
without its RNG state and says so in one line (:mod:`higgsfield._lib.rng_state`). What a
load still trusts: DCP's own ``.metadata`` is a pickle (torch.distributed.checkpoint
reads it with :mod:`pickle`) and DeepSpeed reads its files with ``weights_only=False``;
``trainer.pt`` is read with ``weights_only=True``.

One concept, the save/load pair and what "complete" means across ranks and nodes; its parts
live in :mod:`higgsfield._lib`: the topology (``ckpt_layout``), the shards (``ckpt_shards``),
failures agreed by every rank (``ckpt_agree``), atomic files (``atomic_files``), the RNG
(``rng_state``) and the mirror (``ckpt_mirror``, ``ckpt_from_mirror``).
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from higgsfield._lib import ckpt_layout as layouts
from higgsfield._lib.atomic_files import replace_dir, write_small
from higgsfield._lib.ckpt_agree import agree, attempt
from higgsfield._lib.ckpt_buddy import Buddies, wanted
from higgsfield._lib.ckpt_from_mirror import mirror_token
from higgsfield._lib.ckpt_layout import MARKER, PREFIX, TMP, Layout, step_of
from higgsfield._lib.ckpt_mirror import Part, Uploader, open_mirror
from higgsfield._lib.ckpt_resume import resume_path
from higgsfield._lib.ckpt_shards import load_shards, save_shards, spread_metadata
from higgsfield._lib.hf_meta import HF_DIR, write_hf_meta
from higgsfield._lib.rng_state import load_rng_state, rng_state
from higgsfield.contract.errors import CheckpointError
from higgsfield.contract.layout import CHECKPOINT_DIR_VAR
from higgsfield.contract.layout import checkpoint_dir as layout_checkpoint_dir

__all__ = ["Checkpoint", "CheckpointError", "checkpoint_dir", "MARKER"]


def checkpoint_dir(project: str | None = None, experiment: str | None = None, run: str | None = None,
                   env: dict[str, str] | None = None) -> Path:
    """The run's checkpoint directory (see the module docstring); reads ``env`` (os.environ) now."""
    env = dict(os.environ) if env is None else env
    if env.get(CHECKPOINT_DIR_VAR) and not (project or experiment or run):
        return Path(env[CHECKPOINT_DIR_VAR]).expanduser()
    project = project or env.get("PROJECT_NAME") or "default"
    experiment = experiment or env.get("EXPERIMENT_NAME") or "default"
    run = run or env.get("RUN_NAME") or "default"
    return layout_checkpoint_dir(project, experiment, run)


class Checkpoint:
    """Save and restore model, optimizer, scheduler, scaler, RNG and step as one unit.

    ``every``: save after each ``every`` steps in :meth:`maybe_save`. ``keep_last``:
    complete checkpoints kept (older ones are deleted; None keeps all).
    ``async_save``: write in the background (own gloo group) while training goes on.
    ``mirror``: an fsspec URL (``s3://bucket/prefix``, ``gs://``, ``sftp://``, a path) that each node's
    part is uploaded to after every complete save, in the background; default ``HIGGSFIELD_CHECKPOINT_MIRROR``
    (``checkpoint.mirror`` in higgsfield.yml), ``""`` for none. See :mod:`higgsfield._lib.ckpt_mirror`.
    ``tokenizer``: saved into each step's ``hf/`` with the model's config (default: the loader's ``tokenizer``).
    ``buddies``: in node-local mode, copy each node's part to the next node after every complete save (default
    on; ``HIGGSFIELD_CHECKPOINT_BUDDIES=0`` turns it off). See :mod:`higgsfield._lib.ckpt_buddy`.

    A load never unpickles the RNG files (plain data, ``weights_only=True``; one that is not is skipped with a
    warning) nor ``trainer.pt``; it still trusts DCP's ``.metadata`` (a pickle) and DeepSpeed's own files.
    """

    def __init__(self, model: Any, optimizer: torch.optim.Optimizer, lr_scheduler: Any = None, scaler: Any = None,
                 every: int = 100, keep_last: int | None = 2, directory: str | os.PathLike[str] | None = None,
                 project: str | None = None, experiment: str | None = None, run: str | None = None,
                 async_save: bool = False, mirror: str | None = None, tokenizer: Any = None,
                 buddies: bool | None = None) -> None:
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
        self._layout_cache: Layout | None = None
        self._mirror = open_mirror(mirror, project, experiment, run)
        self._uploader: Uploader | None = None
        self._buddies = Buddies(self.directory, wanted(buddies))

    # -- listing ------------------------------------------------------------------------------

    def complete(self) -> list[Path]:
        """Complete checkpoints, oldest first (a directory without the marker is not one)."""
        if not self.directory.is_dir():
            return []
        found = [p for p in self.directory.iterdir()
                 if p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit() and (p / MARKER).is_file()]
        return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    # -- where the ranks are ------------------------------------------------------------------

    def _layout(self) -> Layout:
        """Shared or node-local, and which rank is on which node. Collective, once (``find_layout``)."""
        if self._layout_cache is None:
            self._layout_cache = layouts.find_layout(self.directory)
        return self._layout_cache

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
        final = self.directory / f"{PREFIX}{next_step:08d}"
        tmp = self.directory / f"{TMP}{final.name}"
        rank = dist.get_rank()
        what = f"save of {final.name}"
        layout = self._layout()
        lead = layout.lead(rank)

        def prepare() -> None:
            if lead:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._remove_partial()  # a killed save's leftovers hold space this one may need
                tmp.mkdir()

        self._agree(what, attempt(prepare, tmp), tmp)

        def write_local() -> None:  # no collective in here: a rank that fails must not strand the others
            if not tmp.is_dir():
                raise FileNotFoundError(f"{tmp} made by this node's first rank is not visible here")
            write_small(rng_state(), tmp / f"rng_rank{rank}.pt")
            if lead:
                write_small(self._trainer_state(next_step, loader), tmp / "trainer.pt")
            if rank == 0:
                write_hf_meta(self.model, self.tokenizer or getattr(loader, "tokenizer", None), tmp / HF_DIR)

        self._agree(what, attempt(write_local, tmp), tmp)
        future: Any = None
        writer: Any = None

        def write_weights() -> None:  # collective; DCP agrees across ranks by itself
            nonlocal future, writer
            future, writer = self._save_weights(tmp, layout)

        self._agree(what, attempt(write_weights, tmp), tmp)
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
            self._agree(what, attempt(future.result, tmp), tmp)
        if not layout.shared and getattr(self.model, "engine", "fsdp") != "deepspeed":
            self._agree(what, spread_metadata(tmp, layout, writer), tmp)
        self._agree(what, attempt(lambda: self._finish(tmp, final, layout), tmp) if lead else None, tmp)
        token = mirror_token(self._mirror)
        self._prune(layout)  # only now, with the new checkpoint complete on every node
        dist.barrier()
        if token is not None and lead:
            self._upload(final, layout, token)
        self._buddies.after_save(final, layout)

    def wait_uploads(self, timeout: float | None = None) -> None:
        """Wait for this node's mirror uploads and buddy copy in flight (the exit waits for the uploads anyway)."""
        if self._uploader is not None:
            self._uploader.join(timeout)
        self._buddies.join(timeout)

    def _upload(self, final: Path, layout: Layout, token: str) -> None:
        """Hand this node's part to the upload thread (a node's lead only); returns at once."""
        assert self._mirror is not None
        node = 0 if layout.shared else layout.node_of[dist.get_rank()]
        if self._uploader is None:
            self._uploader = Uploader(self._mirror, "this node" if layout.shared else f"node {layout.names[node]}")
        self._uploader.submit(Part(step=step_of(final), local=final, index=node,
                                   nparts=1 if layout.shared else len(layout.names), token=token,
                                   keep_last=self.keep_last))

    def _finish(self, tmp: Path, final: Path, layout: Layout) -> None:
        """A node's lead: write the marker (fsync'd) and rename the whole directory into place."""
        layouts.write_marker(tmp, step_of(final), getattr(self.model, "engine", "fsdp"), layout)
        replace_dir(tmp, final, self.directory / f"{TMP}old-{final.name}")

    def _agree(self, what: str, error: str | None, partial: Path | None = None) -> None:
        """Every rank raises the same CheckpointError if any rank failed (:func:`agree`). Collective."""
        agree(what, error, self.directory, partial, self.latest)

    def _save_weights(self, path: Path, layout: Layout) -> tuple[Any, Any]:
        """Write the shards; returns (the future of an async save or None, the DCP writer or None)."""
        group = None
        if self.async_save and getattr(self.model, "engine", "fsdp") != "deepspeed":
            if self._async_group is None:  # sharing the training group with FSDP hangs (TESTBED)
                self._async_group = dist.new_group(backend="gloo")
            group = self._async_group
        return save_shards(self.model, self.optimizer, path, layout, group)

    def _trainer_state(self, next_step: int, loader: Any) -> dict[str, Any]:
        return {"step": next_step, "world_size": dist.get_world_size(),
                "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "loader": loader.state_dict() if loader is not None and hasattr(loader, "state_dict") else None}

    def _remove_partial(self) -> None:
        """Delete every ``.tmp-*`` but the save in flight: never loadable, and they hold disk space."""
        pending = self._pending[1] if self._pending is not None else None
        for stale in self.directory.glob(f"{TMP}*"):
            if stale != pending:
                shutil.rmtree(stale, ignore_errors=True)

    def _prune(self, layout: Layout) -> None:
        """Keep the newest ``keep_last`` checkpoints complete on every node; only after a save completed.

        Collective. A step complete on some nodes only goes too (the mirror keeps its own last k). The steps
        this node is still uploading stay until the upload is done.
        """
        everywhere = set.intersection(*layouts.agreed_steps(layout, self.complete)[0].values())
        if not layout.lead(dist.get_rank()):
            return
        self._remove_partial()
        if self.keep_last is not None:
            keep = set(sorted(everywhere)[-self.keep_last:])
            keep |= self._uploader.steps() if self._uploader is not None else set()  # the mirror reads them now
            for old in self.complete():
                if step_of(old) not in keep:
                    shutil.rmtree(old, ignore_errors=True)
            self._buddies.prune(keep)

    # -- load ---------------------------------------------------------------------------------

    def load_latest(self, loader: Any = None) -> int:
        """Restore the newest checkpoint the nodes hold whole; returns the step to continue from (0 if none).

        Collective: every rank loads the same step, from the nodes' own parts, else put together from
        their buddy copies, else from the mirror (:mod:`higgsfield._lib.ckpt_resume`). When none of
        them makes a step whole, every rank raises the same one-line :class:`CheckpointError` naming
        the node that lacks it.
        """
        found = resume_path(self.directory, self._layout(), self.complete, self._mirror, self._buddies)
        return 0 if found is None else self.load(found, loader)

    def load(self, path: Path, loader: Any = None) -> int:
        """Restore one checkpoint directory; returns the step to continue from. Collective."""
        layout = self._layout()

        def check() -> None:
            if not (path / MARKER).is_file():
                raise FileNotFoundError(f"{path} is not a complete checkpoint on node "
                                        f"{layout.names[layout.node_of[dist.get_rank()]]} (no {MARKER} marker)")
            layouts.check_topology(path, layout)

        self._agree(f"load of {path.name}", attempt(check))
        trainer = torch.load(path / "trainer.pt", map_location="cpu", weights_only=True)
        load_shards(self.model, self.optimizer, path, trainer["world_size"])
        if self.lr_scheduler is not None and trainer["lr_scheduler"] is not None:
            self.lr_scheduler.load_state_dict(trainer["lr_scheduler"])
        if self.scaler is not None and trainer["scaler"] is not None:
            self.scaler.load_state_dict(trainer["scaler"])
        rng = path / f"rng_rank{dist.get_rank()}.pt"
        load_rng_state(rng if rng.is_file() else path / "rng_rank0.pt")  # plain data only: never unpickled
        saved = trainer.get("loader")
        if loader is not None and saved is not None:
            _check_loader(saved, loader.state_dict())
            loader.set_epoch(trainer["step"] // max(len(loader), 1))
        return int(trainer["step"])


def _check_loader(saved: dict[str, Any], now: dict[str, Any]) -> None:
    diff = [k for k in ("seed", "global_batch_size", "rows", "packing") if saved.get(k) != now.get(k)]
    if diff:
        warnings.warn(f"resuming with a different data setup ({', '.join(f'{k}: {saved.get(k)} -> {now.get(k)}' for k in diff)}): "
                      "the data order after the checkpoint differs from the original run", stacklevel=3)

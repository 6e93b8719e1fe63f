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
or ``directory=`` names the run's directory outright. Multi-node runs need that
directory on a filesystem every node shares.

Layout and why::

    <run dir>/step_00000100/          model + optimizer shards (torch.distributed.checkpoint),
        .metadata  __0_0.distcp ...   trainer.pt (scheduler, scaler, step, loader), rng_rank<r>.pt,
        COMPLETE                      written last
    <run dir>/.tmp-step_00000200/     a save in progress (or a crashed one): never loaded

A save is written to ``.tmp-step_*`` and renamed once every rank has finished
and the ``COMPLETE`` marker is on disk, so a crash mid-save leaves nothing that
looks whole. DCP stores each tensor with its global shape, so a checkpoint
written by N ranks loads on M. DeepSpeed uses its own format (same world size
only; convert with ``python -m deepspeed.checkpoint.ds_to_universal`` to change it).

A save that fails (a full disk, a quota, a rank that cannot write) raises
:class:`CheckpointError` on every rank at the same point, never on one rank only
while the others wait in a collective: each phase of a save ends with the ranks
agreeing on whether it worked. Its partial directory is removed at once (it holds
the space a full disk needs back), the complete checkpoints are left as they
were, and keep-last-k only ever prunes after a newer checkpoint is complete, so
the last good one is never deleted because a newer one failed. Leftovers of a
save that was killed (``.tmp-*``) are removed before the next save writes, for
the same reason. Catching the error on every rank and training on is safe.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from higgsfield.errors import CheckpointError

__all__ = ["Checkpoint", "CheckpointError", "checkpoint_dir", "MARKER"]

MARKER = "COMPLETE"
_PREFIX = "step_"
_TMP = ".tmp-"


def checkpoint_dir(project: str | None = None, experiment: str | None = None, run: str | None = None,
                   env: dict[str, str] | None = None) -> Path:
    """The run's checkpoint directory (see the module docstring); reads ``env`` (os.environ) now."""
    env = dict(os.environ) if env is None else env
    if env.get("HIGGSFIELD_CHECKPOINT_DIR") and not (project or experiment or run):
        return Path(env["HIGGSFIELD_CHECKPOINT_DIR"]).expanduser()
    project = project or env.get("PROJECT_NAME") or "default"
    experiment = experiment or env.get("EXPERIMENT_NAME") or "default"
    run = run or env.get("RUN_NAME") or "default"
    return Path.home() / ".cache" / "higgsfield" / project / "experiments" / experiment / run


class Checkpoint:
    """Save and restore model, optimizer, scheduler, scaler, RNG and step as one unit.

    ``every``: save after each ``every`` steps in :meth:`maybe_save`. ``keep_last``:
    complete checkpoints kept (older ones are deleted; None keeps all).
    ``async_save``: write in the background (own gloo group) while training goes on.
    """

    def __init__(self, model: Any, optimizer: torch.optim.Optimizer, lr_scheduler: Any = None, scaler: Any = None,
                 every: int = 100, keep_last: int | None = 2, directory: str | os.PathLike[str] | None = None,
                 project: str | None = None, experiment: str | None = None, run: str | None = None,
                 async_save: bool = False) -> None:
        if every < 1:
            raise ValueError(f"Checkpoint: every must be at least 1, got {every}")
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"Checkpoint: keep_last must be at least 1 or None, got {keep_last}")
        if getattr(model, "precision", None) == "fp16" and getattr(model, "engine", "fsdp") == "fsdp" \
                and scaler is None:
            raise ValueError("Checkpoint: precision='fp16' trains with a loss scaler; pass scaler= so its "
                             "scale is saved and restored")
        self.model, self.optimizer, self.lr_scheduler, self.scaler = model, optimizer, lr_scheduler, scaler
        self.every, self.keep_last, self.async_save = every, keep_last, async_save
        self.directory = Path(directory).expanduser() if directory else checkpoint_dir(project, experiment, run)
        self._pending: tuple[Any, Path, Path] | None = None
        self._async_group: Any = None

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

        def prepare() -> None:
            if rank == 0:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._remove_partial()  # a killed save's leftovers hold space this one may need
                tmp.mkdir()

        self._agree(what, _attempt(prepare, tmp), tmp)

        def write_local() -> None:  # no collective in here: a rank that fails must not strand the others
            if not tmp.is_dir():
                raise FileNotFoundError(f"{tmp} made by rank 0 is not visible here: the checkpoint directory "
                                        "must be on a filesystem every node shares (HIGGSFIELD_CHECKPOINT_DIR)")
            _write_small(_rng_state(), tmp / f"rng_rank{rank}.pt")
            if rank == 0:
                _write_small(self._trainer_state(next_step, loader), tmp / "trainer.pt")

        self._agree(what, _attempt(write_local, tmp), tmp)
        future: Any = None

        def write_weights() -> None:  # collective; DCP agrees across ranks by itself
            nonlocal future
            future = self._save_weights(tmp)

        self._agree(what, _attempt(write_weights, tmp), tmp)
        self._pending = (future, tmp, final)
        if future is None:
            self.wait()
        return final

    def wait(self) -> None:
        """Finish a save in flight: every rank's shards are on disk, then mark and rename. Collective.

        An asynchronous save's failure surfaces here (on every rank, as :class:`CheckpointError`).
        """
        if self._pending is None:
            return
        future, tmp, final = self._pending
        self._pending = None
        what = f"save of {final.name}"
        if future is not None:
            self._agree(what, _attempt(future.result, tmp), tmp)
        self._agree(what, _attempt(lambda: self._finish(tmp, final), tmp) if dist.get_rank() == 0 else None,
                    tmp)
        if dist.get_rank() == 0:
            self._prune()  # only now, with the new checkpoint complete
        dist.barrier()

    def _finish(self, tmp: Path, final: Path) -> None:
        """Rank 0: write the marker (fsync'd) and rename the whole directory into place."""
        with open(tmp / MARKER, "w") as f:
            json.dump({"step": int(final.name[len(_PREFIX):]), "world_size": dist.get_world_size(),
                       "engine": getattr(self.model, "engine", "fsdp"), "time": time.time()}, f)
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

    def _save_weights(self, path: Path) -> Any:
        if getattr(self.model, "engine", "fsdp") == "deepspeed":
            self.model.ds_engine.save_checkpoint(str(path), tag="deepspeed", save_latest=False)
            return None
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(_module(self.model), self.optimizer)
        state = {"model": msd, "optim": osd}
        if not self.async_save:
            dcp.save(state, checkpoint_id=str(path))
            return None
        if self._async_group is None:  # sharing the training group with FSDP hangs (TESTBED)
            self._async_group = dist.new_group(backend="gloo")
        return dcp.async_save(state, checkpoint_id=str(path), process_group=self._async_group)

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

    def _prune(self) -> None:
        """Keep the newest ``keep_last`` complete checkpoints; called only after a save completed."""
        self._remove_partial()
        if self.keep_last is not None:
            for old in self.complete()[:-self.keep_last]:
                shutil.rmtree(old, ignore_errors=True)

    # -- load ---------------------------------------------------------------------------------

    def load_latest(self, loader: Any = None) -> int:
        """Restore the newest complete checkpoint; returns the step to continue from (0 if none)."""
        choice = [str(self.latest()) if dist.get_rank() == 0 and self.latest() else None]
        dist.broadcast_object_list(choice, src=0)  # every rank loads the same one
        if choice[0] is None:
            return 0
        return self.load(Path(choice[0]), loader)

    def load(self, path: Path, loader: Any = None) -> int:
        """Restore one checkpoint directory; returns the step to continue from. Collective."""
        def check() -> None:
            if not (path / MARKER).is_file():
                raise FileNotFoundError(f"{path} is not a complete checkpoint here (no {MARKER} marker); "
                                        "on several nodes the directory must be on a filesystem they share")

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

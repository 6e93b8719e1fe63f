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
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Checkpoint", "checkpoint_dir", "MARKER"]

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
        """Save the state after step ``step``; a resume continues at ``step + 1``. Collective."""
        self.wait()
        next_step = step + 1
        final = self.directory / f"{_PREFIX}{next_step:08d}"
        tmp = self.directory / f"{_TMP}{final.name}"
        rank = dist.get_rank()
        if rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        dist.barrier()
        future = self._save_weights(tmp)
        torch.save(_rng_state(), tmp / f"rng_rank{rank}.pt")
        if rank == 0:
            torch.save(self._trainer_state(next_step, loader), tmp / "trainer.pt")
        self._pending = (future, tmp, final)
        if future is None:
            self.wait()
        return final

    def wait(self) -> None:
        """Finish a save in flight: every rank's shards are on disk, then mark and rename. Collective."""
        if self._pending is None:
            return
        future, tmp, final = self._pending
        self._pending = None
        if future is not None:
            future.result()
        dist.barrier()
        if dist.get_rank() == 0:
            marker = tmp / MARKER
            with open(marker, "w") as f:
                json.dump({"step": int(final.name[len(_PREFIX):]), "world_size": dist.get_world_size(),
                           "engine": getattr(self.model, "engine", "fsdp"), "time": time.time()}, f)
                f.flush()
                os.fsync(f.fileno())
            shutil.rmtree(final, ignore_errors=True)  # a re-save of the same step
            os.rename(tmp, final)
            _fsync_dir(self.directory)
            self._prune()
        dist.barrier()

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

    def _prune(self) -> None:
        for stale in self.directory.glob(f"{_TMP}*"):
            if self._pending is None or stale != self._pending[1]:
                shutil.rmtree(stale, ignore_errors=True)
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
        if not (path / MARKER).is_file():
            raise ValueError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
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


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""Which :class:`~higgsfield.control.backends.backend.Backend` holds a project's runs (one rule, one place)."""

from __future__ import annotations

from pathlib import Path

from higgsfield.control.backends.backend import Backend
from higgsfield.control.backends.nodes import pull as nodes_pull
from higgsfield.control.backends.nodes.backend import NodesBackend
from higgsfield.control.backends.slurm import pull as slurm_pull
from higgsfield.control.backends.slurm.backend import SlurmBackend
from higgsfield.control.config import Config


def backend_for(cfg: Config) -> Backend:
    """Its Slurm cluster when higgsfield.yml has a ``slurm:`` block (the SSH ``nodes`` are then not used), else its nodes."""
    if cfg.slurm is not None:
        return SlurmBackend(cfg)
    return NodesBackend(cfg)


async def pull(cfg: Config, target: str, dest: Path | None = None, *, step: str | int | None = None,
               logs: bool = False, progress: nodes_pull.Progress | None = None) -> nodes_pull.PullResult:
    """``higgsfield pull`` from the backend that holds the project's runs (the same rule as :func:`backend_for`)."""
    on = slurm_pull if cfg.slurm is not None else nodes_pull
    return await on.pull(cfg, target, dest, step=step, logs=logs, progress=progress)

"""Which :class:`~higgsfield.orchestrator.backend.Backend` holds a project's runs (one rule, one place)."""

from __future__ import annotations

from higgsfield.config import Config
from higgsfield.orchestrator.backend import Backend
from higgsfield.orchestrator.nodes_backend import NodesBackend
from higgsfield.orchestrator.slurm_backend import SlurmBackend


def backend_for(cfg: Config) -> Backend:
    """Its Slurm cluster when higgsfield.yml has a ``slurm:`` block (the SSH ``nodes`` are then not used), else its nodes."""
    if cfg.slurm is not None:
        return SlurmBackend(cfg)
    return NodesBackend(cfg)

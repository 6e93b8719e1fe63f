"""``higgsfield pull`` on a Slurm cluster: the login node is the one node, and the run's checkpoint is in its shared workdir."""

from __future__ import annotations

from pathlib import Path

from higgsfield.control.backends.nodes.pull import Part, Progress, PullResult, pull_parts
from higgsfield.control.backends.slurm.backend import SlurmBackend
from higgsfield.control.config import Config


async def pull(cfg: Config, target: str, dest: Path | None = None, *, step: str | int | None = None,
               logs: bool = False, progress: Progress | None = None) -> PullResult:
    """Bring ``target``'s checkpoint step (and with ``logs`` its logs) from the cluster's workdir to ``dest``."""
    async with SlurmBackend(cfg).session() as s:
        status = await s.find(target)
        part = Part(s.transport.node, s.transport, s.cluster.invoker_argv())
        return await pull_parts(status, [part], dest, step, logs, progress or Progress())

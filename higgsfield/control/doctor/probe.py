"""What the doctor asks a node in its one probe, and what the node answered (:class:`Facts`).

Every read-only command the checks need (:func:`reads`) goes to the node in one SSH session
(:func:`higgsfield.control.remote.probe.probe`); the answers come back as :class:`Facts`, which
every check reads by argv. Its own module because both sides meet here: the asking
(:mod:`~higgsfield.control.doctor.diagnosis`) and the reading (:mod:`~higgsfield.control.doctor.checks`)
must name the same commands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from higgsfield.control.backends.slurm import preflight as pf
from higgsfield.control.remote.base import CommandResult
from higgsfield.control.remote.docker_info import DOCKER_INFO
from higgsfield.control.remote.invoker import invoker_argv, invoker_bin
from higgsfield.control.remote.probe import Clock

if TYPE_CHECKING:
    from higgsfield.control.config import Config, NodeConfig
    from higgsfield.control.config.slurm import SlurmConfig

COMMAND_TIMEOUT_S = 20.0

SUDO_OK = ("sudo", "-n", "true")
GPU_QUERY = ("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader")
SMI = ("nvidia-smi",)
DF_HOME = ("df", "-Pk", ".")
DF_IMAGES = ("sh", "-c", 'd=$(docker info --format "{{.DockerRootDir}}" 2>/dev/null) && [ -n "$d" ] && df -Pk "$d"')


@dataclass
class Facts:
    """What one node answered: the probe's results by argv, its login's uid, its clock."""

    node: str
    answers: dict[tuple[str, ...], CommandResult] = field(default_factory=dict)
    uid: int | None = None
    clock: Clock | None = None

    def __call__(self, argv: Sequence[str]) -> CommandResult:
        got = self.answers.get(tuple(argv))
        return got if got is not None else CommandResult(self.node, tuple(argv), 127, "", "not asked")


def reads(cfg: Config, node: NodeConfig) -> list[tuple[str, ...]]:
    """Every command the checks read on ``node``."""
    env = _env_argv(cfg, node)
    if cfg.slurm is not None:  # a cluster's login node: Slurm's view instead of sudo, Docker and local GPUs
        return [_version_argv(cfg, node), _usage_argv(cfg, node), *([env] if env else []), *_slurm_reads(cfg.slurm)]
    out = [SUDO_OK, DOCKER_INFO, GPU_QUERY, SMI, DF_HOME, DF_IMAGES, _version_argv(cfg, node), _usage_argv(cfg, node),
           runs_argv(cfg, node)]
    return out + ([env] if env else [])


def _slurm_reads(s: SlurmConfig) -> list[tuple[str, ...]]:
    return [pf.WHICH, pf.SINFO, pf.test_only_argv(s)]


def _version_argv(cfg: Config, node: NodeConfig) -> tuple[str, ...]:
    return (*invoker_bin(cfg, node), "--version")


def _usage_argv(cfg: Config, node: NodeConfig) -> tuple[str, ...]:
    return (*invoker_argv(cfg, node), "usage", "--project", cfg.name)


def runs_argv(cfg: Config, node: NodeConfig) -> tuple[str, ...]:
    """The node's records of the project's runs (the nodes active runs lost: :mod:`higgsfield.control.doctor.lost`)."""
    return (*invoker_argv(cfg, node), "status", "--project", cfg.name)


def _env_argv(cfg: Config, node: NodeConfig) -> tuple[str, ...] | None:
    if cfg.runtime == "docker":
        return None
    argv = [*invoker_argv(cfg, node), "env", "--project", cfg.name, "--check"]
    if node.is_local:
        argv += ["--code-dir", str(cfg.project_dir)]
    return tuple(argv)

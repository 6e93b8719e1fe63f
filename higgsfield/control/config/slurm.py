"""The ``slurm:`` block of higgsfield.yml: where the cluster is and what a run asks of it, typed and checked.

One model for both ends. Config loading validates it like every other block (unknown keys
refused, a bad value one line naming the file, the line and the field; the JSON Schema
editors complete from), and the Slurm backend runs with it as it is: the compute nodes'
python is :attr:`SlurmConfig.interpreter`, and a run's ``--nodes``, ``--time`` and
``--partition`` make a checked copy (:meth:`SlurmConfig.override`).

Values end up in an ``#SBATCH`` line or an argument of ``sbatch``/``squeue``, so each is
held to Slurm's own syntax (:mod:`higgsfield.contract.slurm_syntax`) before anything is sent.
"""

from __future__ import annotations

import posixpath
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, field_validator

from higgsfield.contract.errors import ConfigError
from higgsfield.contract.layout import VENV
from higgsfield.contract.names import check_host, check_node_name, check_text
from higgsfield.contract.slurm_syntax import (
    MAX_GPUS_PER_NODE,
    MAX_NODES,
    check_abs_path,
    check_account,
    check_extra_option,
    check_partition,
    check_time,
    check_workdir,
)
from higgsfield.contract.text import shown
from higgsfield.control.config.fields import Int, Model, Port, checked, no_bool, refuse_root

__all__ = ["LoginConfig", "SlurmConfig"]


def _login_shorthand(v: Any) -> Any:
    return {"host": v} if isinstance(v, str) else v


class LoginConfig(Model):
    """The cluster's login node: reached over SSH like any node, its host key pinned by ``setup``."""

    host: str = Field(..., min_length=1, description="The login node's host name or address.")
    user: str | None = Field(None, description="Your user on the cluster; default: ssh.user, else your local user.")
    port: Port = Field(22, description="SSH port.")
    name: str = Field("login", description="How logs and errors call the login node.")
    identity_file: str | None = Field(None, description="Private key file; default: ssh.identity_file.")

    _user = field_validator("user")(classmethod(lambda cls, v: refuse_root(v)))
    _host = checked("host", check=check_host)
    _name = checked("name", check=check_node_name)
    _identity = checked("identity_file", check=check_text)


def _time_limit(v: Any) -> Any:
    return check_time(no_bool(v))


class SlurmConfig(Model):
    """A Slurm cluster: runs are batch jobs submitted through its login node (``nodes`` is then not used)."""

    login: Annotated[LoginConfig, BeforeValidator(_login_shorthand)] = Field(
        ..., description="The login node: {host: login.cluster.example, user: me}.")
    workdir: str = Field(..., description="An absolute path every compute node sees: releases, the project "
                                          "environment, runs, logs and checkpoints live there.")
    partition: str | None = Field(None, description="Partition (or several, comma-separated); default: the "
                                                    "cluster's default. --partition per run.")
    account: str | None = Field(None, description="Account to charge; default: your default account.")
    nodes: Int = Field(1, ge=1, le=MAX_NODES, description="Nodes per run (one torchrun each). --nodes per run.")
    gpus_per_node: Int = Field(0, ge=0, le=MAX_GPUS_PER_NODE,
                               description="GPUs per node (--gpus-per-node; 0 for a CPU partition).")
    cpus_per_task: Int | None = Field(None, ge=1, le=4096, description="CPUs for each node's torchrun.")
    time: Annotated[str, BeforeValidator(_time_limit)] | None = Field(
        None, description="Time limit: minutes, HH:MM:SS or D-HH:MM:SS (quoted); default: the partition's. "
                          "--time per run.")
    python: str | None = Field(None, description="The compute nodes' python for runs; default: the project "
                                                 "environment deploy builds in the workdir.")
    exclusive: bool = Field(True, description="Whole nodes (--exclusive): each node's torchrun uses all of it.")
    extra: list[str] = Field(default_factory=list, description="More sbatch options, one '--name=value' each.")

    _workdir = checked("workdir", check=check_workdir)
    _partition = checked("partition", check=check_partition)
    _account = checked("account", check=check_account)
    _python = checked("python", check=check_abs_path)

    @field_validator("extra")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        return [check_extra_option(o) for o in v]

    @property
    def interpreter(self) -> str:
        """The compute nodes' python for runs: ``python``, else the project environment's in the workdir."""
        return self.python or posixpath.join(self.workdir, VENV, "bin", "python")

    def override(self, *, nodes: int | None = None, time: str | None = None, partition: str | None = None,
                 where: str = "") -> SlurmConfig:
        """A copy with a run's ``--nodes``, ``--time`` and ``--partition`` (None: the block's own).

        A value from the command line never went through config loading, so each is held to
        its field's check here: a bad one is one ConfigError line naming ``where`` and the flag
        (``--nodes: expected a whole number from 1 to 4096 (got 0)``). This block is left as it is.
        """
        changes: dict[str, Any] = {}
        if nodes is not None:
            if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
                raise ConfigError(f"{where}--nodes: expected a whole number from 1 to {MAX_NODES} "
                                  f"(got {shown(nodes)})")
            changes["nodes"] = nodes
        for flag, value, check in (("time", time, check_time), ("partition", partition, check_partition)):
            if value is not None:
                try:
                    changes[flag] = check(value)
                except ValueError as e:
                    raise ConfigError(f"{where}--{flag}: {e}") from None
        return self.model_copy(update=changes)

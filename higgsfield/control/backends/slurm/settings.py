"""The ``slurm:`` block of higgsfield.yml, typed and checked: where the cluster is and what a run asks of it.

A plain dataclass with :meth:`SlurmSettings.from_mapping` so the config package can
embed it (``slurm: {...}`` -> ``SlurmSettings.from_mapping(d, "higgsfield.yml: slurm")``)
and a run can override ``nodes``, ``time`` and ``partition`` (:meth:`SlurmSettings.override`).
Every error is one line naming the field and what to write instead
(:class:`~higgsfield.contract.errors.ConfigError`, exit 2).

Values end up in an ``#SBATCH`` line or an argument of ``sbatch``/``squeue``, so each
is held to Slurm's own syntax (:mod:`higgsfield.contract.slurm_syntax`, shared with the typed
config) before anything is sent.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from higgsfield.contract.errors import ConfigError
from higgsfield.contract.names import check_host, check_node_name, check_text, check_user
from higgsfield.contract.slurm_syntax import (
    MAX_GPUS_PER_NODE,
    MAX_NODES,
    SLURM_WORD_RE,
    check_abs_path,
    check_account,
    check_extra_option,
    check_partition,
    check_time,
    check_workdir,
    seconds,
)
from higgsfield.contract.text import shown

__all__ = ["MAX_GPUS_PER_NODE", "MAX_NODES", "SLURM_WORD_RE", "Login", "SlurmSettings", "check_account",
           "check_partition", "check_time", "seconds"]

@dataclass(frozen=True)
class Login:
    """The login node: reached over SSH like any node (its host key pinned by ``setup``)."""

    host: str
    user: str | None = None
    port: int = 22
    name: str = "login"            # how logs and errors call it
    identity_file: str | None = None


@dataclass(frozen=True)
class SlurmSettings:
    """What the project asks of its Slurm cluster (``nodes``, ``time``, ``partition`` can change per run)."""

    login: Login
    workdir: str                    # shared by every compute node: releases, venv, runs, checkpoints
    partition: str | None = None    # None: the cluster's default partition
    account: str | None = None      # None: the user's default account
    nodes: int = 1
    gpus_per_node: int = 0          # 0: no --gpus-per-node (a CPU partition)
    cpus_per_task: int | None = None
    time: str | None = None         # None: the partition's default time limit
    python: str | None = None       # the project environment's python; default <workdir>/venv/bin/python
    exclusive: bool = True          # whole nodes (--exclusive): a node's torchrun uses all of it
    extra: tuple[str, ...] = field(default=())   # more sbatch options, each one '--name=value' word

    @property
    def interpreter(self) -> str:
        return self.python or posixpath.join(self.workdir, "venv", "bin", "python")

    @classmethod
    def from_mapping(cls, d: object, where: str = "slurm") -> SlurmSettings:
        """The settings in ``d`` (the parsed ``slurm:`` block); ConfigError names ``where``.field."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"{where}: expected a mapping of settings (login, workdir, partition, ...)")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in d if k not in known)
        if unknown:
            raise ConfigError(f"{where}: unknown key {shown(unknown[0])}; the keys are {', '.join(sorted(known))}")
        if "login" not in d or "workdir" not in d:
            missing = "login" if "login" not in d else "workdir"
            raise ConfigError(f"{where}.{missing} is required "
                              + ("(login: {host: login.cluster.example, user: me})" if missing == "login"
                                 else "(an absolute path every compute node sees, e.g. /shared/me/higgsfield)"))
        settings = cls(
            login=_login(d["login"], f"{where}.login"),
            workdir=_workdir(d["workdir"], f"{where}.workdir"),
            partition=_opt(d, "partition", where, check_partition),
            account=_opt(d, "account", where, check_account),
            nodes=_int(d.get("nodes", 1), f"{where}.nodes", 1, MAX_NODES),
            gpus_per_node=_int(d.get("gpus_per_node", 0), f"{where}.gpus_per_node", 0, MAX_GPUS_PER_NODE),
            cpus_per_task=None if d.get("cpus_per_task") is None
            else _int(d["cpus_per_task"], f"{where}.cpus_per_task", 1, 4096),
            time=_opt(d, "time", where, check_time),
            python=None if d.get("python") is None else _abs_path(d["python"], f"{where}.python"),
            exclusive=_bool(d.get("exclusive", True), f"{where}.exclusive"),
            extra=_extra(d.get("extra", ()), f"{where}.extra"),
        )
        return settings

    def override(self, *, nodes: int | None = None, time: str | None = None, partition: str | None = None,
                 where: str = "") -> SlurmSettings:
        """These settings with a run's ``--nodes``, ``--time`` and ``--partition`` (each checked, ``where`` + flag)."""
        changes: dict[str, Any] = {}
        if nodes is not None:
            changes["nodes"] = _int(nodes, f"{where}--nodes", 1, MAX_NODES)
        if time is not None:
            changes["time"] = _checked(check_time, time, f"{where}--time")
        if partition is not None:
            changes["partition"] = _checked(check_partition, partition, f"{where}--partition")
        return replace(self, **changes)


def _checked(check: Any, value: object, where: str) -> Any:
    try:
        return check(value)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None


def _opt(d: Mapping[str, Any], key: str, where: str, check: Any) -> Any:
    v = d.get(key)
    return None if v is None else _checked(check, v, f"{where}.{key}")


def _int(v: object, where: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ConfigError(f"{where}: expected a whole number from {lo} to {hi} (got {shown(v)})")
    return v


def _bool(v: object, where: str) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{where}: expected true or false (got {shown(v)})")
    return v


def _abs_path(v: object, where: str) -> str:
    return str(_checked(check_abs_path, v, where))


def _workdir(v: object, where: str) -> str:
    return str(_checked(check_workdir, v, where))


def _login(v: object, where: str) -> Login:
    if isinstance(v, str):
        v = {"host": v}
    if not isinstance(v, Mapping):
        raise ConfigError(f"{where}: expected {{host: login.cluster.example, user: me}}")
    unknown = sorted(str(k) for k in v if k not in {f.name for f in fields(Login)})
    if unknown:
        raise ConfigError(f"{where}: unknown key {shown(unknown[0])}; the keys are host, user, port, name, "
                          "identity_file")
    if "host" not in v:
        raise ConfigError(f"{where}.host is required (the login node's host name)")
    return Login(
        host=_checked(check_host, v["host"], f"{where}.host"),
        user=None if v.get("user") is None else _checked(check_user, v["user"], f"{where}.user"),
        port=_int(v.get("port", 22), f"{where}.port", 1, 65535),
        name=_checked(check_node_name, v.get("name", "login"), f"{where}.name"),
        identity_file=None if v.get("identity_file") is None
        else _checked(check_text, v["identity_file"], f"{where}.identity_file"),
    )


def _extra(v: object, where: str) -> tuple[str, ...]:
    """More sbatch options (``--qos=high``, ``--constraint=a100``): one safe word each."""
    if isinstance(v, str) or not isinstance(v, (list, tuple)):
        raise ConfigError(f"{where}: expected a list of sbatch options such as ['--qos=high']")
    out = []
    for i, opt in enumerate(v):
        out.append(_checked(check_extra_option, opt, f"{where}[{i}]"))
    return tuple(out)

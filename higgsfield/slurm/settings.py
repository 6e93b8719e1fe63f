"""The ``slurm:`` block of higgsfield.yml, typed and checked: where the cluster is and what a run asks of it.

A plain dataclass with :meth:`SlurmSettings.from_mapping` so the config package can
embed it (``slurm: {...}`` -> ``SlurmSettings.from_mapping(d, "higgsfield.yml: slurm")``)
and a run can override ``nodes``, ``time`` and ``partition`` (:meth:`SlurmSettings.override`).
Every error is one line naming the field and what to write instead
(:class:`~higgsfield.errors.ConfigError`, exit 2).

Values end up in an ``#SBATCH`` line or an argument of ``sbatch``/``squeue``, so each
is held to Slurm's own syntax here, before anything is sent: a partition or account is
one word (a partition list is words joined by commas), a time limit is one of Slurm's
forms (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``, or
``UNLIMITED``), the workdir an absolute path every compute node sees.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from higgsfield.errors import ConfigError
from higgsfield.names import check_host, check_node_name, check_text, check_user
from higgsfield.text import shown

#: A partition or account: Slurm names them freely, but a name that is one word is all a cluster uses.
SLURM_WORD_RE = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")
_TIME_RE = re.compile(
    r"\A(?:\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}|\d+-\d{1,2}:\d{1,2}|\d+-\d{1,2}:\d{1,2}:\d{1,2})\Z")
_UNLIMITED = frozenset({"UNLIMITED", "INFINITE"})
MAX_NODES = 4096
MAX_GPUS_PER_NODE = 64


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


# -- one value each: ValueError with the reason (the caller prefixes the field) ------------------

def check_partition(value: object) -> str:
    """A partition, or several joined by commas (Slurm then takes the first that can start the job)."""
    if not isinstance(value, str) or not all(SLURM_WORD_RE.fullmatch(p) for p in value.split(",")):
        raise ValueError(f"{shown(value)} is not a partition name: use letters, digits, _ . - "
                         "(several partitions joined by commas)")
    return value


def check_account(value: object) -> str:
    if not isinstance(value, str) or not SLURM_WORD_RE.fullmatch(value):
        raise ValueError(f"{shown(value)} is not an account name: use letters, digits, _ . -")
    return value


def check_time(value: object) -> str:
    """A Slurm time limit: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or UNLIMITED."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)
    if not isinstance(value, str) or not (_TIME_RE.fullmatch(value) or value.upper() in _UNLIMITED):
        raise ValueError(f"{shown(value)} is not a Slurm time limit: write minutes (90), HH:MM:SS (24:00:00) "
                         "or D-HH:MM:SS (2-00:00:00), quoted in YAML")
    if value.upper() not in _UNLIMITED and seconds(value) <= 0:
        raise ValueError(f"{shown(value)} is a time limit of zero: give the run some time")
    return value.upper() if value.upper() in _UNLIMITED else value


def seconds(value: str) -> int:
    """The seconds of a Slurm time limit (checked by :func:`check_time`); -1 for UNLIMITED."""
    if value.upper() in _UNLIMITED:
        return -1
    days = 0
    if "-" in value:
        d, value = value.split("-", 1)
        days = int(d)
        parts = [int(p) for p in value.split(":")]
        h, m, s = (parts + [0, 0])[:3]
    else:
        parts = [int(p) for p in value.split(":")]
        if len(parts) == 1:
            h, m, s = 0, parts[0], 0
        elif len(parts) == 2:
            h, m, s = 0, parts[0], parts[1]
        else:
            h, m, s = parts
    return ((days * 24 + h) * 60 + m) * 60 + s


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
    path = _checked(check_text, v, where)
    if not path.startswith("/"):
        raise ConfigError(f"{where}: {shown(path)} must be an absolute path (a directory every compute node "
                          "sees, e.g. /shared/me/higgsfield); '~' is not expanded on a cluster")
    if ".." in path.split("/"):
        raise ConfigError(f"{where}: {shown(path)} must not contain '..'")
    return posixpath.normpath(path)


_PLAIN_PATH_RE = re.compile(r"\A/[A-Za-z0-9_./+@:,=-]*\Z")


def _workdir(v: object, where: str) -> str:
    """An absolute path of plain characters: it appears in ``#SBATCH --output=``, which sbatch reads itself."""
    path = _abs_path(v, where)
    if not _PLAIN_PATH_RE.fullmatch(path):
        raise ConfigError(f"{where}: {shown(path)} has a blank, a quote or '%' in it, which sbatch would misread "
                          "in '#SBATCH --output=': use letters, digits and _ . / + @ : , = -")
    return path


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


_EXTRA_RE = re.compile(r"\A--[a-z][a-z0-9-]*(?:=[A-Za-z0-9_.,:=/@%+-]+)?\Z")


def _extra(v: object, where: str) -> tuple[str, ...]:
    """More sbatch options (``--qos=high``, ``--constraint=a100``): one safe word each."""
    if isinstance(v, str) or not isinstance(v, (list, tuple)):
        raise ConfigError(f"{where}: expected a list of sbatch options such as ['--qos=high']")
    out = []
    for i, opt in enumerate(v):
        if not isinstance(opt, str) or not _EXTRA_RE.fullmatch(opt):
            raise ConfigError(f"{where}[{i}]: {shown(opt)} is not one sbatch option '--name' or '--name=value' "
                              "(letters, digits and _ . , : = / @ % + -)")
        out.append(opt)
    return tuple(out)

"""Slurm's value syntax: a partition, an account, a time limit, a workdir, an extra sbatch option.

Each value ends up in an ``#SBATCH`` line or an argument of ``sbatch``/``squeue``, so it is
held to Slurm's own syntax before anything is sent. The checks live here, apart from
:mod:`higgsfield.control.backends.slurm`, because both the typed config (:mod:`higgsfield.control.config.slurm`,
which the remote layer imports) and the Slurm engine use them: a neutral, stdlib-only
module keeps the two from importing each other in a circle.

Every check returns the value (normalized) or raises ``ValueError`` with the reason in
words; the caller prefixes the file, line and field.
"""

from __future__ import annotations

import posixpath
import re

from higgsfield.contract.names import check_text
from higgsfield.contract.text import shown

#: A partition or account: Slurm names them freely, but a name that is one word is all a cluster uses.
SLURM_WORD_RE = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")
_TIME_RE = re.compile(
    r"\A(?:\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}|\d+-\d{1,2}:\d{1,2}|\d+-\d{1,2}:\d{1,2}:\d{1,2})\Z")
_UNLIMITED = frozenset({"UNLIMITED", "INFINITE"})
_PLAIN_PATH_RE = re.compile(r"\A/[A-Za-z0-9_./+@:,=-]*\Z")
_EXTRA_RE = re.compile(r"\A--[a-z][a-z0-9-]*(?:=[A-Za-z0-9_.,:=/@%+-]+)?\Z")
MAX_NODES = 4096
MAX_GPUS_PER_NODE = 64


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


def check_abs_path(value: object) -> str:
    """An absolute path on the cluster (``~`` is not expanded there), without ``..``; normalized."""
    path = check_text(value)
    if not path.startswith("/"):
        raise ValueError(f"{shown(path)} must be an absolute path (a directory every compute node sees, e.g. "
                         "/shared/me/higgsfield); '~' is not expanded on a cluster")
    if ".." in path.split("/"):
        raise ValueError(f"{shown(path)} must not contain '..'")
    return posixpath.normpath(path)


def check_workdir(value: object) -> str:
    """An absolute path of plain characters: it appears in ``#SBATCH --output=``, which sbatch reads itself."""
    path = check_abs_path(value)
    if not _PLAIN_PATH_RE.fullmatch(path):
        raise ValueError(f"{shown(path)} has a blank, a quote or '%' in it, which sbatch would misread "
                         "in '#SBATCH --output=': use letters, digits and _ . / + @ : , = -")
    return path


def check_extra_option(value: object) -> str:
    """One more sbatch option (``--qos=high``, ``--constraint=a100``): one safe word."""
    if not isinstance(value, str) or not _EXTRA_RE.fullmatch(value):
        raise ValueError(f"{shown(value)} is not one sbatch option '--name' or '--name=value' "
                         "(letters, digits and _ . , : = / @ % + -)")
    return value

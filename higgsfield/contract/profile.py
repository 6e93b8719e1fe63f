"""``higgsfield profile``: what crosses each seam when a live run's ranks are profiled for a few steps.

Laptop -> node: ``invoker profile --project P --run R --steps N [--rank R] [--memory] --timeout S``.
Node -> rank: :class:`ProfileRequest`, written to ``RUN_DIR/profile/request.json``; each rank of a
higgsfield run reads it at most once a second, beside its progress write
(:mod:`higgsfield._lib.profile_arm`), profiles its next ``steps`` steps with ``torch.profiler`` and
leaves ``RUN_DIR/profile/<id>/rank<N>.trace.json`` (Chrome trace) and, last,
``rank<N>.done.json`` (:class:`RankDone`). Node -> laptop: :class:`ProfileReply`, the files listed
with sizes and sha256 as ``invoker files`` lists a pull's, so they come home by pull's transport.

Stdlib only: the node agent, the worker and the laptop all read it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from higgsfield.contract.codec import rule
from higgsfield.contract.replies import Reply, Typed, run_name, run_state
from higgsfield.contract.replies_disk import FileEntry

PROFILE = "profile"                 # RUN_DIR/profile/: the request and one folder of results per request
REQUEST = "request.json"
ID_RE = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}")
MAX_STEPS = 100


def _steps(v: int) -> None:
    if not 1 <= v <= MAX_STEPS:
        raise ValueError(f"must be an integer from 1 to {MAX_STEPS}")


def _id(v: str) -> None:
    if not ID_RE.fullmatch(v):
        raise ValueError("must be a profile id (YYYYmmdd-HHMMSS-xxxxxx)")


def request_path(run_dir: str | os.PathLike[str]) -> Path:
    """``RUN_DIR/profile/request.json``: the newest request, read by every rank of the run on this node."""
    return Path(run_dir) / PROFILE / REQUEST


def results_dir(run_dir: str | os.PathLike[str], pid: str) -> Path:
    """``RUN_DIR/profile/<id>/``: the ranks' traces of one request."""
    return Path(run_dir) / PROFILE / pid


def trace_name(rank: int) -> str:
    return f"rank{rank}.trace.json"


def done_name(rank: int) -> str:
    return f"rank{rank}.done.json"


def memory_name(rank: int) -> str:
    return f"rank{rank}.memory.pickle"


@dataclass(frozen=True)
class ProfileRequest(Typed):
    """What the node asks of its ranks: profile the next ``steps`` steps (``ranks``: only those; empty: all),
    until ``deadline`` (unix time: a rank that reads it later, a restarted one, leaves it)."""

    WHAT: ClassVar[str] = "profile request"

    id: str = field(metadata=rule(check=_id))
    steps: int = field(metadata=rule(check=_steps))
    deadline: float
    ranks: list[int] = field(default_factory=list)
    memory: bool = False


@dataclass(frozen=True)
class RankDone(Typed):
    """``rank<N>.done.json``, written last: the steps profiled, the device, the memory snapshot's file (or why
    none), and ``error`` when the profiler failed (the run itself went on)."""

    WHAT: ClassVar[str] = "profiled rank"

    rank: int
    steps: list[int] = field(default_factory=list)
    device: str = "cpu"
    memory: str = ""          # the snapshot's file name, or "" (memory_note says why)
    memory_note: str = ""
    error: str = ""
    seconds: float = 0.0      # the profiled steps' wall time on this rank


@dataclass(frozen=True)
class ProfileReply(Reply):
    """``invoker profile``: each asked rank on the node as it answered (``done``), the ranks that did not
    answer in time (``missing``), and the result files under ``root`` (size, sha256)."""

    WHAT: ClassVar[str] = "profile reply"

    run: str = field(metadata=rule(check=run_name))
    state: str = field(metadata=rule(check=run_state))
    id: str = ""
    root: str = ""
    done: list[RankDone] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    files: list[FileEntry] = field(default_factory=list)

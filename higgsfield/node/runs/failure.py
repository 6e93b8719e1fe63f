"""What failed on this node, read from the run's directory once torchrun ended non-zero.

A failure (:class:`higgsfield.contract.failure.Failure`) travels to the coordinator and
into every node's record: node, rank, at, reason, tail. ``at`` is when the rank
failed by its own account, so the coordinator can tell the first failure from the
ones it caused on other nodes (ranks blocked in a collective fail when a peer dies):

- ``rank<N>.error.json``, written by the entrypoint when user code raises, or by the
  rank's tee the moment the rank died without a Python exception (a signal: the OOM
  killer's SIGKILL, SIGSEGV, SIGABRT; or ``os._exit``); the earliest of this attempt
  names the rank;
- torchrun's own summary in ``launcher.log`` ("Root Cause (first observed
  failure)") adds the exit code or signal, and names the rank when no error file
  exists;
- no summary and an exit status other than 1: torchrun itself died (killed, or out
  of memory), and its ranks with it;
- else only torchrun's (or the container's) exit status is known.

``tail`` is the last lines of that rank's log (the traceback's end, or what it printed
before it died), else of the launcher's log.
"""

from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from higgsfield.contract.codec import decode, rule
from higgsfield.contract.decode import cut, read_json
from higgsfield.contract.failure import Failure
from higgsfield.node.state.records import RunDir

TAIL_LINES = 12
LINE_CHARS = 300
_ROOT = re.compile(r"Root Cause \(first observed failure\):(.*)", re.S)
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)", re.M)
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.M)


def describe(rd: RunDir, node: str, rc: int, since: float) -> Failure:
    """The failure of this node's part of the run (torchrun ended with ``rc``; it started at ``since``)."""
    error = first_error(rd, since)
    root = torchrun_root_cause(rd.launcher_log)
    rank: int | None = error.rank if error else (root[0] if root else None)
    code = root[1] if root and root[0] == rank else None
    if error and error.kind != "died":
        reason = f"rank {rank}: {error.error}"
    elif root is None and rc not in (0, 1):  # no summary: torchrun itself died (its ranks died with it)
        reason = f"torchrun {exit_words(rc)}" + (f"; rank {rank} ended with it" if rank is not None else "")
        rank = None  # the rank is a casualty, not the cause: whether its tee wrote first is a race
    elif rank is not None and code is not None and code != 0:
        reason = f"rank {rank} {exit_words(code)}"
    elif error:
        reason = f"rank {rank} {error.error}"
    else:
        reason = f"torchrun {exit_words(rc)}"
    log = rd.rank_log(rank) if rank is not None else rd.launcher_log
    tail = tail_lines(log) or tail_lines(rd.launcher_log)
    return Failure(node=node, rank=rank, at=error.time if error else time.time(), reason=reason[:LINE_CHARS * 2],
                   tail=tail)


def exit_words(code: int) -> str:
    """``exited 3``, ``was killed by SIGKILL (out of memory?)``: a process's or a container's exit status."""
    sig = -code if code < 0 else code - 128 if 128 < code < 160 else None
    if sig is None:
        return f"exited {code}"
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    return f"was killed by {name}" + (" (out of memory?)" if sig == signal.SIGKILL else "")


def _counted(v: int) -> None:
    if v < 0:
        raise ValueError("must be >= 0")


def _one_line(v: str) -> str:
    return cut(" ".join(v.split()) or "failed", LINE_CHARS * 2)


@dataclass(frozen=True)
class RankError:
    """``rank<N>.error.json``, decoded: the rank, when it failed by its own account, what (one line), how."""

    WHAT: ClassVar[str] = "rank's error file"

    rank: int = field(metadata=rule(check=_counted))
    time: float
    error: str = field(default="failed", metadata=rule(check=_one_line))
    kind: str | None = None     # "exception" (user code raised) | "died" (no Python exception: a signal)
    code: int | None = None     # the rank's own exit code: 1 for an exception, N for SystemExit(N)


def first_error(rd: RunDir, since: float) -> RankError | None:
    """The earliest ``rank*.error.json`` written at or after ``since`` (one that does not decode is no error)."""
    best: RankError | None = None
    for p in rd.logs.glob("rank*.error.json"):
        try:
            e = decode(RankError, read_json(p, root=rd.home.root))
        except (OSError, ValueError):
            continue
        if e.time >= since and (best is None or e.time < best.time):
            best = e
    return best


def before(rd: RunDir, node: str, rc: int, since: float, told: Failure | None) -> Failure | None:
    """This node's own failure if one of its ranks failed before ``told`` (the failure an abort named).

    A rank that raises ends its process group, which breaks another node's collective; that
    node's torchrun may end first and be reported first, and its "connection reset" named as the
    run's cause. Said to the coordinator, the earlier failure here is the run's first.
    """
    own = describe(rd, node, rc, since)
    if own.rank is None or told is None or own.at >= told.at:
        return None
    return own


def rank_code(rd: RunDir, since: float) -> int | None:
    """The exit code the first failing rank gave itself (1 for an exception), when it recorded one."""
    error = first_error(rd, since)
    return error.code if error is not None and error.kind != "died" else None


def torchrun_root_cause(launcher_log: Path) -> tuple[int, int] | None:
    """(global rank, exit code) of torchrun's last "Root Cause" summary, if it wrote one."""
    text = read_end(launcher_log, 64 * 1024)
    found = None
    for m in _ROOT.finditer(text):
        found = m
    if found is None:
        return None
    block = found.group(1)
    rank, code = _RANK.search(block), _EXIT.search(block)
    if not rank or not code:
        return None
    return int(rank.group(1)), int(code.group(1))


def tail_lines(path: Path, n: int = TAIL_LINES) -> list[str]:
    """The last ``n`` non-blank lines of ``path`` (each cut to a sane length)."""
    lines = [ln.rstrip() for ln in read_end(path, 16 * 1024).splitlines() if ln.strip()]
    return [ln if len(ln) <= LINE_CHARS else ln[:LINE_CHARS] + "..." for ln in lines[-n:]]


def read_end(path: Path, size: int) -> str:
    """The last ``size`` bytes of ``path`` as text ("" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            end = f.tell()
            f.seek(max(0, end - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""

"""Slurm's answers as data: :class:`Job` from ``squeue`` and ``sacct`` lines, sbatch's one-line reason.

Pure functions of the text the commands print: the job id, state (normalized by
:mod:`higgsfield.control.backends.slurm.states`), pending reason, ``EXIT:SIGNAL`` exit code,
compressed node list and timestamps. Its own module because it runs nothing: the client
(:mod:`higgsfield.control.backends.slurm.client`) and the preflight
(:mod:`higgsfield.control.backends.slurm.preflight`) both read Slurm through it, and it is
tested against canned output.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from higgsfield.control.backends.slurm.states import normalize


@dataclass(frozen=True)
class Job:
    """What Slurm says about one job right now."""

    job_id: str
    state: str                  # Slurm's word, normalized: PENDING, RUNNING, COMPLETED, CANCELLED, ...
    reason: str | None = None
    exit_code: int | None = None
    nodes: tuple[str, ...] = ()
    submitted_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None


def sbatch_error(text: str) -> str:
    """The one line that says why (``Invalid partition name specified``), from sbatch's/scancel's stderr."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return "no reason given"
    last = lines[-1]
    for prefix in ("sbatch: error: Batch job submission failed:", "sbatch: error:", "scancel: error:", "error:"):
        if last.startswith(prefix):
            return last[len(prefix):].strip()
    return last


def parse_squeue(out: str) -> dict[str, Job]:
    jobs = {}
    for line in out.splitlines():
        parts = line.split("|", 6)
        if len(parts) != 7 or not parts[0].strip().isdigit():
            continue
        job_id, state, nodes, submit, start, end, reason = (p.strip() for p in parts)
        jobs[job_id] = Job(job_id, normalize(state), _reason(reason), None, _nodes(nodes),
                           _time(submit), _time(start) if normalize(state) != "PENDING" else None, _time(end))
    return jobs


def parse_sacct(out: str) -> dict[str, Job]:
    jobs = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) < 8 or not parts[0].strip().isdigit():
            continue
        job_id, state, code, nodes, submit, start, end = (p.strip() for p in parts[:7])
        reason = "|".join(parts[7:]).strip()
        jobs[job_id] = Job(job_id, normalize(state), _reason(reason), exit_code(code), _nodes(nodes),
                           _time(submit), _time(start), _time(end))
    return jobs


def exit_code(text: str) -> int | None:
    """Slurm's ``EXIT:SIGNAL`` (``3:0``, ``0:9``) as one status: the exit code, or 128 + the signal."""
    try:
        code, _, sig = text.partition(":")
        c, s = int(code), int(sig or 0)
    except ValueError:
        return None
    return c if c or not s else 128 + s


def _reason(text: str) -> str | None:
    text = text.strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    return None if text in ("", "None", "(null)") else text


def _nodes(text: str) -> tuple[str, ...]:
    text = text.strip()
    return () if text in ("", "(null)", "None assigned", "n/a") else expand_nodelist(text)


def expand_nodelist(text: str) -> tuple[str, ...]:
    """Slurm's compressed host list (``n[1-3,7],gpu-a``, ``node[01-02]``) as names; an odd one stays whole."""
    out: list[str] = []
    for m in _HOSTLIST.finditer(text):
        prefix, ranges, suffix = m.group(1), m.group(2), m.group(3) or ""
        if ranges is None:
            out.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                return (text,)
            width = len(lo)
            out += [f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi or lo) + 1)]
    return tuple(out) or (text,)


_HOSTLIST = re.compile(r"([^,\[\]]+)(?:\[([0-9,-]+)\]([^,\[\]]*))?")


def _time(text: str) -> float | None:
    text = text.strip()
    if not text or text in ("N/A", "Unknown", "None", "(null)"):
        return None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None

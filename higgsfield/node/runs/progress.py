"""This node's latest progress of a run: the newest step any of its ranks reported, else the newest output line.

Every rank of a run reports its step through :func:`higgsfield.training.progress`
(``StepTimer.step`` does it) into ``RUN_DIR/progress/rank<N>`` (``STEP UNIXTIME``,
:func:`higgsfield.contract.layout.progress_path`). The supervisor reads
:func:`latest` about once a second and tells the run's coordinator when it advanced;
the coordinator's :class:`~higgsfield.node.gang.watchdog.Watchdog` decides a stall.

A run that reports no steps (a loop of its own) still shows life in its output:
then the newest modification time of its rank logs is its progress (``steps``
False). Once any rank reports steps only steps count, so a rank printing
"waiting..." while the run hangs does not hide the hang.

With its progress the node sends its ranks' own work per step (``RUN_DIR/progress/work<N>``,
written by :mod:`higgsfield._lib.straggler_probe`; :func:`work`), which the coordinator's
straggler rule judges (:mod:`higgsfield.node.gang.stragglers`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from higgsfield.contract import layout
from higgsfield.contract.straggler import RankWork, parse_work
from higgsfield.node.state.records import RunDir


@dataclass(frozen=True)
class Progress:
    """When this node's run last progressed (wall time), and whether from reported steps (else output lines)."""

    at: float
    steps: bool
    work: tuple[RankWork, ...] = ()
    """Its ranks' latest own work per step (none: no rank measures it)."""


def latest(rd: RunDir) -> Progress | None:
    """The newest progress of ``rd``'s ranks on this node, or None before the first."""
    stepped = _newest_step(rd)
    if stepped is not None:
        return Progress(stepped, True, work(rd))
    output = _newest_output(rd)
    return Progress(output, False) if output is not None else None


def _reports(rd: RunDir) -> list[tuple[int, float]]:
    """Each rank's last report, ``(step, wall time)``; a file absent, half-written or not ours is skipped."""
    try:
        entries = list(os.scandir(rd.path / layout.PROGRESS))
    except OSError:
        return []
    out = []
    for e in entries:
        if not e.name.startswith("rank"):
            continue
        try:
            with open(e.path, "rb") as f:
                fields = f.read(128).split()
            out.append((int(float(fields[0])), float(fields[1])))
        except (OSError, IndexError, ValueError):
            continue
    return out


def work(rd: RunDir) -> tuple[RankWork, ...]:
    """This node's ranks' latest own work per step (``progress/work<N>``); a file half-written or not ours is
    skipped."""
    try:
        entries = list(os.scandir(rd.path / layout.PROGRESS))
    except OSError:
        return ()
    out = []
    for e in entries:
        if not (e.name.startswith("work") and e.name[4:].isdigit()):
            continue
        try:
            with open(e.path, "rb") as f:
                got = parse_work(int(e.name[4:]), f.read(128))
        except OSError:
            continue
        if got is not None:
            out.append(got[0])
    return tuple(sorted(out, key=lambda w: w.rank))


def _newest_step(rd: RunDir) -> float | None:
    return max((at for _, at in _reports(rd)), default=None)


def _newest_output(rd: RunDir) -> float | None:
    newest: float | None = None
    try:
        entries = list(os.scandir(rd.logs))
    except OSError:
        return None
    for e in entries:
        if not (e.name.startswith("rank") and e.name.endswith(".log")):
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_size > 0:
            newest = st.st_mtime if newest is None else max(newest, st.st_mtime)
    return newest


def newest_step(rd: RunDir) -> int | None:
    """The highest step any of this node's ranks reported (what a message about the run names), or None."""
    return max((step for step, _ in _reports(rd)), default=None)

"""The node's queue: runs that want the same slots never overlap; FIFO order.

A node has *slots*: its GPUs (indices 0..G-1), or on a node without GPUs one slot
per CPU core (``os.cpu_count()``). A run wants ``nproc_per_node`` slots (on a CPU
node at most all of them), or every slot with ``exclusive``. Runs that fit on
disjoint slots run side by side (each gets its GPU indices: ``CUDA_VISIBLE_DEVICES``
in the process runtime, device requests in Docker); a run that does not fit waits as
``queued`` and starts by itself when slots free up.

Order is FIFO by the time the *control side* submitted the run (then the run name),
not by arrival on the node, so every node of a multi-node run sees the same order and
two runs sharing nodes cannot each hold half of them. Only the head of the queue may
take slots (no overtaking).

State: ``<state>/queue.json`` (entries: run, wanted slots, held slots, supervisor
pid), changed only under an exclusive ``flock`` of ``<state>/queue.lock``; the lock is
held for a read-modify-write, never while waiting. Entries whose supervisor is gone
are dropped (a supervisor is known by pid and start time, so a reused pid does not
keep a dead run's slots), so a crash never leaks slots.

Use (in the supervisor)::

    slots = acquire(state_dir, entry, should_stop=lambda: killed(), on_wait=mark_queued)
    try: ... finally: release(state_dir, project, run)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from higgsfield.invoker import pids


@dataclass
class Entry:
    project: str
    run: str
    want: int
    exclusive: bool
    order: float              # the control side's submit time
    pid: int                  # the run's supervisor
    slots: list[int] | None = None
    pid_start: int | None = None  # the supervisor's start time: a reused pid is not it
    enqueued_at: float = field(default_factory=time.time)

    @property
    def key(self) -> tuple[str, str]:
        return (self.project, self.run)


@dataclass(frozen=True)
class Capacity:
    slots: int
    gpus: bool


def capacity(gpus: int) -> Capacity:
    """GPUs when the node has some, else one slot per CPU core."""
    if gpus > 0:
        return Capacity(gpus, True)
    return Capacity(os.cpu_count() or 1, False)


def wanted(nproc: int, exclusive: bool, cap: Capacity) -> int:
    """How many slots a run takes; on CPU nodes at most all of them (GPU nodes are checked at launch)."""
    if exclusive:
        return cap.slots
    return min(nproc, cap.slots) if not cap.gpus else nproc


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / "queue.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _load(state_dir: Path) -> list[Entry]:
    try:
        data = json.loads((state_dir / "queue.json").read_text())
    except (OSError, ValueError):
        return []
    out = []
    for d in data if isinstance(data, list) else []:
        with contextlib.suppress(TypeError):
            out.append(Entry(**d))
    return out


def _save(state_dir: Path, entries: list[Entry]) -> None:
    from higgsfield.invoker.records import write_json

    write_json(state_dir / "queue.json", [asdict(e) for e in entries], mode=0o600)


def _alive(e: Entry) -> bool:
    return pids.alive(e.pid, e.pid_start)


def _fifo(e: Entry) -> tuple[float, str]:
    return (e.order, e.run)


def snapshot(state_dir: Path) -> list[Entry]:
    """The live entries, holders first then waiters in FIFO order."""
    with _locked(state_dir):
        entries = [e for e in _load(state_dir) if _alive(e)]
    return sorted(entries, key=lambda e: (e.slots is None, _fifo(e)))


def try_acquire(state_dir: Path, me: Entry, cap: Capacity) -> list[int] | None:
    """Take ``me``'s slots if it is the head of the queue and they are free; else enqueue it."""
    with _locked(state_dir):
        entries = [e for e in _load(state_dir) if _alive(e) and e.key != me.key]
        mine = next((e for e in _load(state_dir) if e.key == me.key), None)
        if mine is not None and mine.slots is not None:
            return mine.slots
        held = {s for e in entries if e.slots is not None for s in e.slots}
        waiting = sorted([e for e in entries if e.slots is None] + [me], key=_fifo)
        free = [s for s in range(cap.slots) if s not in held]
        got: list[int] | None = None
        if waiting[0] is me and me.want <= len(free) and not (me.exclusive and held):
            got = free[:me.want]
            me.slots = got
        _save(state_dir, [*entries, me])
        return got


def release(state_dir: Path, project: str, run: str) -> None:
    with _locked(state_dir):
        entries = [e for e in _load(state_dir) if e.key != (project, run) and _alive(e)]
        _save(state_dir, entries)


def acquire(state_dir: Path, me: Entry, cap: Capacity, *, should_stop: Callable[[], bool],
            on_wait: Callable[[list[Entry]], None] | None = None, poll: float = 0.5) -> list[int] | None:
    """Wait (polling) until ``me`` holds its slots; None if ``should_stop()`` turned true first."""
    announced = False
    while True:
        if should_stop():
            release(state_dir, me.project, me.run)
            return None
        got = try_acquire(state_dir, me, cap)
        if got is not None:
            return got
        if not announced and on_wait:
            on_wait([e for e in snapshot(state_dir) if e.key != me.key])
            announced = True
        time.sleep(poll)


def describe(entries: list[Entry]) -> list[dict[str, Any]]:
    return [asdict(e) for e in entries]

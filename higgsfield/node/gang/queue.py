"""The node's queue: runs that want the same slots never overlap; FIFO order; gang-safe.

A node has *slots*: its GPUs (indices 0..G-1), or on a node without GPUs one slot
per CPU core (``os.cpu_count()``). A run wants ``nproc_per_node`` slots (on a CPU
node at most all of them), or every slot with ``exclusive``. Runs that fit on
disjoint slots run side by side (each gets its GPU indices: ``CUDA_VISIBLE_DEVICES``
in the process runtime, device requests in Docker); a run that does not fit waits as
``queued`` and starts by itself when slots free up.

Order is FIFO by the time the *control side* submitted the run (then the run name),
not by arrival on the node, so every node of a multi-node run sees the same order.
Only the head of the queue may take slots (no overtaking).

A multi-node run starts only when every one of its nodes holds its slots (gang
admission, driven by the run's coordinator, :mod:`higgsfield.node.gang.coordinator`).
Slots a run holds while it waits for its other nodes are *not committed*, and an
older run that arrives on this node takes them back (the younger one waits again):
two runs submitted at the same moment that reach two nodes in opposite orders can
therefore never each hold half of what the other needs (no deadlock), and the older
one goes first everywhere. Once every node holds its slots the coordinator has them
*committed* (``commit``; undone by ``uncommit`` if another node lost its slots
meanwhile); committed slots are never taken back, and the run starts.

Allocation is a pure function of the entries, recomputed under the lock: committed
entries keep their slots; the others, oldest first, get slots while they fit, and
the first one that does not fit stops the line.

State: ``<state>/queue.json`` (entries: run, wanted slots, held slots, committed,
rendezvous port, supervisor pid), changed only under an exclusive ``flock`` of
``<state>/queue.lock`` (both :class:`~higgsfield.node.state.home.NodeState`'s); the lock is held for a read-modify-write, never while waiting.
Entries whose supervisor is gone are dropped (a supervisor is known by pid and start
time, so a reused pid does not keep a dead run's slots), so a crash never leaks slots.

Use (in the supervisor)::

    slots = try_acquire(home, entry, cap)           # None: wait (poll again)
    holds(home, entry.key)                          # False: an older run took them back
    commit(home, entry.key) ... release(home, project, run)
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from higgsfield.contract.codec import decode
from higgsfield.contract.decode import DecodeError, read_json
from higgsfield.contract.names import NAME_RE, is_run_name
from higgsfield.node.state import pids
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.locks import exclusive


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
    committed: bool = False   # its slots are its own until it ends (the run started or is starting)
    port: int | None = None   # the rendezvous port node 0 reserved for this run

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


def _locked(home: NodeState) -> contextlib.AbstractContextManager[None]:
    return exclusive(home.queue_lock)


def _load(home: NodeState) -> list[Entry]:
    """The stored entries, each decoded and checked (:func:`entry_of`); a damaged file or entry is left out:
    it can only be a crash's leftover, and the supervisors that are alive add themselves again."""
    try:
        data = read_json(home.queue_file, root=home.root)
    except (OSError, ValueError):
        return []
    out = []
    for d in data if isinstance(data, list) else []:
        with contextlib.suppress(ValueError):
            out.append(entry_of(d))
    return out


def entry_of(d: object) -> Entry:
    """One queue entry from parsed JSON, every field typed and its names valid (DecodeError otherwise)."""
    e = decode(Entry, d)
    if not NAME_RE.fullmatch(e.project) or not is_run_name(e.run):
        raise DecodeError("a queue entry's project or run is not a valid name")
    return e


def _save(home: NodeState, entries: list[Entry]) -> None:
    from higgsfield.node.state.records import write_json

    write_json(home.queue_file, [asdict(e) for e in entries], mode=0o600)


def _alive(e: Entry) -> bool:
    return pids.alive(e.pid, e.pid_start)


def _fifo(e: Entry) -> tuple[float, str]:
    return (e.order, e.run)


def allocate(entries: list[Entry], cap: Capacity) -> dict[tuple[str, str], list[int] | None]:
    """Who holds which slots: committed entries keep theirs; the rest, oldest first, while they fit."""
    out: dict[tuple[str, str], list[int] | None] = {}
    free = set(range(cap.slots))
    for e in entries:
        if e.committed and e.slots is not None:
            out[e.key] = e.slots
            free -= set(e.slots)
    blocked = False
    for e in sorted((e for e in entries if not (e.committed and e.slots is not None)), key=_fifo):
        need = cap.slots if e.exclusive else e.want
        if blocked or need > len(free):
            blocked = True   # no overtaking: nobody younger gets slots before this one
            out[e.key] = None
            continue
        mine = set(e.slots or ())
        got = sorted(mine) if len(mine) == need and mine <= free else sorted(free)[:need]
        out[e.key] = got
        free -= set(got)
    return out


def _update(home: NodeState, me: Entry, cap: Capacity) -> list[Entry]:
    """Under the lock: the live entries (``me`` added or refreshed), allocation recomputed, saved if changed."""
    stored = _load(home)
    entries = [e for e in stored if _alive(e) and e.key != me.key]
    prev = next((e for e in stored if e.key == me.key), None)
    if prev is not None:
        me.slots, me.committed, me.port = prev.slots, prev.committed, prev.port
    entries.append(me)
    alloc = allocate(entries, cap)
    for e in entries:
        e.slots = alloc[e.key]
    if [asdict(e) for e in entries] != [asdict(e) for e in stored]:
        _save(home, entries)
    return entries


def try_acquire(home: NodeState, me: Entry, cap: Capacity) -> list[int] | None:
    """``me``'s slots if it is at the head of the queue and they are free (or already its); else None (it waits)."""
    with _locked(home):
        entries = _update(home, me, cap)
    return next(e.slots for e in entries if e.key == me.key)


def holds(home: NodeState, me: Entry, cap: Capacity) -> list[int] | None:
    """The slots ``me`` holds now (an older run may have taken uncommitted ones back: None then)."""
    return try_acquire(home, me, cap)


def commit(home: NodeState, key: tuple[str, str]) -> bool:
    """Make ``key``'s slots its own (no older run takes them back); False if it holds none now."""
    return _set_committed(home, key, True)


def uncommit(home: NodeState, key: tuple[str, str]) -> None:
    """Undo :func:`commit` (another node of the run lost its slots before the run could start)."""
    _set_committed(home, key, False)


def _set_committed(home: NodeState, key: tuple[str, str], value: bool) -> bool:
    with _locked(home):
        entries = [e for e in _load(home) if _alive(e)]
        mine = next((e for e in entries if e.key == key), None)
        if mine is None or mine.slots is None:
            return False
        mine.committed = value
        _save(home, entries)
        return True


def reserve_port(home: NodeState, key: tuple[str, str], extra: Iterable[int] = ()) -> int:
    """A free rendezvous port for ``key`` that no other live entry reserved; recorded in its entry."""
    from higgsfield.contract.ports import free_port

    with _locked(home):
        entries = [e for e in _load(home) if _alive(e)]
        taken = {e.port for e in entries if e.port and e.key != key} | set(extra)
        port = free_port(taken)
        for e in entries:
            if e.key == key:
                e.port = port
        _save(home, entries)
    return port


def reserved_ports(home: NodeState) -> set[int]:
    """Rendezvous ports held by this node's live runs (bound or about to be)."""
    with _locked(home):
        return {e.port for e in _load(home) if e.port and _alive(e)}


def release(home: NodeState, project: str, run: str) -> None:
    with _locked(home):
        entries = [e for e in _load(home) if e.key != (project, run) and _alive(e)]
        _save(home, entries)


def snapshot(home: NodeState) -> list[Entry]:
    """The live entries, holders first then waiters in FIFO order."""
    with _locked(home):
        entries = [e for e in _load(home) if _alive(e)]
    return sorted(entries, key=lambda e: (e.slots is None, _fifo(e)))


def describe(entries: list[Entry]) -> list[dict[str, Any]]:
    return [asdict(e) for e in entries]

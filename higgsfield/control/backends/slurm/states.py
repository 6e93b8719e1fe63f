"""Slurm's job states in the run states every view of a run uses (:mod:`higgsfield.contract.runspec`).

==========================================================  ==========  =========================
Slurm                                                        run state   reason
==========================================================  ==========  =========================
PENDING                                                      queued      Slurm's (Resources, Priority, ...)
REQUEUED, REQUEUE_HOLD, REQUEUE_FED, RESV_DEL_HOLD          queued      "requeued" + Slurm's reason
RUNNING, CONFIGURING, COMPLETING, RESIZING, SIGNALING,      running
STAGE_OUT, SUSPENDED, STOPPED
COMPLETED                                                    succeeded
CANCELLED (``CANCELLED by 1000`` in sacct)                   killed
FAILED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL,        failed      what the state means
DEADLINE, PREEMPTED, REVOKED, SPECIAL_EXIT
==========================================================  ==========  =========================

A state this table does not know (a newer Slurm's) reads as running while the job is
still listed: it is never mistaken for an end.
"""

from __future__ import annotations

from dataclasses import dataclass

from higgsfield.contract.states import FAILED, KILLED, QUEUED, RUNNING, SUCCEEDED

_QUEUED = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
_RUNNING = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "RESIZING", "SIGNALING", "STAGE_OUT",
                      "SUSPENDED", "STOPPED", "UPDATE_DB", "POWER_UP_NODE"})
#: Why a job failed, in words, by its end state.
FAILURES = {
    "FAILED": "a task exited non-zero",
    "TIMEOUT": "the job reached its time limit",
    "NODE_FAIL": "a node of the allocation failed",
    "OUT_OF_MEMORY": "a task ran out of memory",
    "BOOT_FAIL": "a node failed to boot",
    "DEADLINE": "the job reached its deadline",
    "PREEMPTED": "the job was preempted",
    "REVOKED": "the job was revoked (a federated sibling started)",
    "SPECIAL_EXIT": "the job ended with a special exit (held for a requeue)",
}
#: Slurm's reasons that say nothing (``None`` in squeue).
_NO_REASON = frozenset({"", "None", "(null)", "none"})


@dataclass(frozen=True)
class Mapped:
    state: str
    reason: str | None = None


def normalize(raw: str) -> str:
    """``CANCELLED by 1000`` -> ``CANCELLED``; ``cancelled+`` (sacct's truncation mark) -> ``CANCELLED``."""
    word = raw.strip().split(" ", 1)[0].rstrip("+").upper()
    return word


def map_state(raw: str, reason: str | None = None) -> Mapped:
    """The run state (and the reason to show) for Slurm's ``raw`` state and its ``reason`` column."""
    state = normalize(raw)
    why = None if reason is None or reason.strip() in _NO_REASON else reason.strip()
    if state in _QUEUED:
        if state == "PENDING":
            return Mapped(QUEUED, why)
        return Mapped(QUEUED, "requeued" + (f" ({why})" if why else ""))
    if state in _RUNNING:
        return Mapped(RUNNING, None)
    if state == "COMPLETED":
        return Mapped(SUCCEEDED, None)
    if state == "CANCELLED":
        return Mapped(KILLED, "cancelled (scancel)" if why is None else f"cancelled ({why})")
    if state in FAILURES:
        words = FAILURES[state]
        return Mapped(FAILED, f"{state}: {words}" + (f" ({why})" if why and why != state else ""))
    return Mapped(RUNNING, f"Slurm state {state}" if state else None)


def is_terminal(raw: str) -> bool:
    m = map_state(raw)
    return m.state in (SUCCEEDED, FAILED, KILLED)

"""A Slurm run's status: one RunStatus from the submission record, Slurm's view of the job and the job's record.

A job's state comes from ``squeue`` while Slurm holds it, then from ``sacct`` when the
cluster keeps accounting, else from the run's own record (``run.json``, written by the job);
the record adds what only the node side knows (the failing rank and node, the error's last
lines, the run's attempts and the nodes it lost and went on without, the ranks named stragglers). Its own module because the merge is a pure function of those three, shared by
``status`` and ``statuses`` of :class:`~higgsfield.control.backends.slurm.client.SlurmCluster`
and tested without a cluster.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from higgsfield.contract.codec import decode
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.nodepart import NodePart
from higgsfield.contract.noderuns import NodeRunView
from higgsfield.contract.runstatus import RunStatus
from higgsfield.contract.slurmjob import SlurmJob
from higgsfield.contract.states import ACTIVE, FAILED, KILLED, QUEUED, RUNNING, STALLED
from higgsfield.control.backends.slurm.parse import Job
from higgsfield.control.backends.slurm.states import map_state


def merge(submitted: SlurmJob, job: Job | None, record: NodeRunView | Mapping[str, Any] | None) -> RunStatus:
    """One RunStatus from the submission record (``job.json``, decoded), Slurm's view of the job and the job's
    own run record (``run.json``: decoded here, once, if it is still its parsed JSON).

    Slurm decides the state while it knows the job; the job's record adds what only
    the node side knows (the failing rank and node, the error's last lines, a stall: a job Slurm runs
    whose watchdog found it stuck, ``on_stall: wait``, is ``stalled``). Without
    either (no accounting and the job long gone), the record's state stands.
    """
    rec = record if isinstance(record, NodeRunView) or record is None else _decoded(record)
    state, reason = QUEUED, None
    if job is not None:
        mapped = map_state(job.state, job.reason)
        state, reason = mapped.state, mapped.reason
        if state == QUEUED and rec is not None and rec.state == QUEUED and rec.reason:
            reason = f"{rec.reason}; {reason}" if reason else rec.reason   # our own requeue: why
        elif state == RUNNING and rec is not None and rec.state == STALLED:   # Slurm runs it; its watchdog: stuck
            state, reason = STALLED, rec.reason
    elif rec is not None:
        state, reason = rec.state, rec.reason
    failed_node = failed_rank = None
    tail: list[str] = []
    if state == FAILED and rec is not None:
        if rec.state == FAILED and rec.reason:
            reason = rec.reason if job is None or job.state == "FAILED" else f"{reason}; {rec.reason}"
        failed_node, failed_rank, tail = rec.failed_node, rec.failed_rank, list(rec.error_tail)
    elif state == KILLED and job is None:
        reason = rec.reason if rec is not None else None
    hosts = job.nodes if job and job.nodes else ((rec.node,) if rec is not None else ())
    return RunStatus(
        project=submitted.project or (rec.project if rec is not None else ""),
        experiment=submitted.experiment or (rec.experiment if rec is not None else ""),
        run=submitted.run or (rec.run if rec is not None else ""),
        state=state,
        nodes={str(h): NodePart(state=state) for h in hosts if h},
        created_at=float(submitted.submitted_at or (rec.created_at if rec is not None else 0.0)),
        started_at=(job.started_at if job and job.started_at else rec.started_at if rec is not None else None),
        ended_at=(job.ended_at if job and job.ended_at and state not in ACTIVE
                  else rec.ended_at if rec is not None else None),
        exit_code=(job.exit_code if job and job.exit_code is not None else rec.exit_code if rec is not None else None),
        failed_node=failed_node, failed_rank=failed_rank, reason=reason, error_tail=tail,
        params=dict(submitted.params), stall=rec.stall if rec is not None else None,
        stragglers=list(rec.stragglers) if rec is not None and state in ACTIVE else [],
        attempts=list(rec.attempts) if rec is not None else [], lost=list(rec.lost) if rec is not None else [])


def _decoded(record: Mapping[str, Any]) -> NodeRunView | None:
    """The job's ``run.json`` (its parsed JSON) as the typed record the node side wrote; one that does not
    decode counts as none, as one that is not JSON does (the state then is Slurm's, or queued)."""
    with contextlib.suppress(DecodeError):
        return decode(NodeRunView, dict(record))
    return None

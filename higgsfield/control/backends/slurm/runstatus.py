"""A Slurm run's status: one RunStatus from the submission record, Slurm's view of the job and the job's record.

A job's state comes from ``squeue`` while Slurm holds it, then from ``sacct`` when the
cluster keeps accounting, else from the run's own record (``run.json``, written by the job);
the record adds what only the node side knows (the failing rank and node, the error's last
lines). Its own module because the merge is a pure function of those three, shared by
``status`` and ``statuses`` of :class:`~higgsfield.control.backends.slurm.client.SlurmCluster`
and tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from higgsfield.contract.decode import DecodeError
from higgsfield.contract.runspec import ACTIVE, FAILED, KILLED, QUEUED, RUNNING, STALLED, RunStatus
from higgsfield.contract.slurmjob import SlurmJob
from higgsfield.contract.stacks import Diagnosis
from higgsfield.control.backends.slurm.parse import Job
from higgsfield.control.backends.slurm.states import map_state


def merge(submitted: SlurmJob, job: Job | None, record: Mapping[str, Any] | None) -> RunStatus:
    """One RunStatus from the submission record (``job.json``, decoded), Slurm's view of the job and the job's
    own run record (``run.json``).

    Slurm decides the state while it knows the job; the job's record adds what only
    the node side knows (the failing rank and node, the error's last lines, a stall: a job Slurm runs
    whose watchdog found it stuck, ``on_stall: wait``, is ``stalled``). Without
    either (no accounting and the job long gone), the record's state stands.
    """
    rec = dict(record or {})
    state, reason = QUEUED, None
    if job is not None:
        mapped = map_state(job.state, job.reason)
        state, reason = mapped.state, mapped.reason
        if state == QUEUED and rec.get("state") == QUEUED and rec.get("reason"):
            reason = f"{rec['reason']}; {reason}" if reason else str(rec["reason"])  # our own requeue: why
        elif state == RUNNING and rec.get("state") == STALLED:   # Slurm runs it; its watchdog says it is stuck
            state, reason = STALLED, rec.get("reason")
    elif rec.get("state"):
        state, reason = str(rec["state"]), rec.get("reason")
    failed_node = failed_rank = None
    tail: list[str] = []
    if state == FAILED:
        if rec.get("state") == FAILED and rec.get("reason"):
            reason = str(rec["reason"]) if job is None or job.state == "FAILED" else f"{reason}; {rec['reason']}"
        failed_node, failed_rank = rec.get("failed_node"), rec.get("failed_rank")
        tail = [str(x) for x in rec.get("error_tail") or []]
    elif state == KILLED and job is None:
        reason = rec.get("reason")
    node_state = state
    hosts = job.nodes if job and job.nodes else ((str(rec["node"]),) if rec.get("node") else ())
    return RunStatus(
        project=submitted.project or str(rec.get("project") or ""),
        experiment=submitted.experiment or str(rec.get("experiment") or ""),
        run=submitted.run or str(rec.get("run") or ""),
        state=state,
        nodes={str(h): {"state": node_state} for h in hosts if h},
        created_at=float(submitted.submitted_at or rec.get("created_at") or 0.0),
        started_at=(job.started_at if job and job.started_at else rec.get("started_at")),
        ended_at=(job.ended_at if job and job.ended_at and state not in ACTIVE else rec.get("ended_at")),
        exit_code=(job.exit_code if job and job.exit_code is not None else rec.get("exit_code")),
        failed_node=failed_node, failed_rank=failed_rank, reason=reason, error_tail=tail,
        params=dict(submitted.params), stall=_stall(rec.get("stall")))


def _stall(v: object) -> dict[str, Any] | None:
    """The record's diagnosis of the run's stall, checked by its contract type (one that does not decode: none)."""
    if v is None:
        return None
    try:
        return Diagnosis.from_dict(v).to_dict()
    except DecodeError:
        return None

"""How one start of a Slurm job ends, as its batch step writes it: failed, requeued for a restart, or requeued
without a lost node.

The batch step (:func:`higgsfield.node.slurm_task.batch`) runs the job's ``srun`` line and
then calls one of these with the run's record: :func:`ended` when the step failed (a rank
crashed: requeued while ``--max-restarts`` allows, as after a stall, :func:`stalled`), or
:func:`lost` when a node of the allocation is gone (:mod:`higgsfield.node.slurm_recovery`:
requeued without it while ``--max-recoveries`` allows). A requeue leaves the next start its
reason (:func:`higgsfield.node.slurm_recovery.note`) and the run's secrets (0600); an end
that is final deletes them. Apart from the task's program so that the job's roles stay
readable, one concern each.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, replace

from higgsfield.contract.failure import Failure
from higgsfield.contract.layout import SECRETS, node_of_rank
from higgsfield.contract.names import check_node_name
from higgsfield.contract.runspec import RunSpec
from higgsfield.contract.stall_policy import OnStall
from higgsfield.contract.states import FAILED, QUEUED
from higgsfield.node import slurm_recovery
from higgsfield.node.runs.failure import describe, read_end
from higgsfield.node.slurm_run import now, put_secrets_back, write_record
from higgsfield.node.slurm_stall import Stall
from higgsfield.node.state.records import RunDir, RunRecord

_SRUN_TASK_ERROR = re.compile(r"srun: error: ([A-Za-z0-9_.:-]+): task (\d+): (.*)")


@dataclass(frozen=True)
class Start:
    """What an end needs of this start: the job, the run's limits and what they allow now, its secrets."""

    job_id: str
    spec: RunSpec
    max_restarts: int
    restarts: int             # restarts so far, this start's own included
    recoveries: int           # recoveries so far, this start's own included
    secrets: dict[str, str]
    hosts: tuple[str, ...] = ()

    @property
    def may_recover(self) -> bool:
        """Whether a lost node would be recovered from (so Slurm may start the job again: keep the secrets)."""
        return bool(self.job_id) and self.recoveries < self.spec.max_recoveries


def final(rd: RunDir) -> None:
    """The run's secrets gone: nothing starts this job again."""
    (rd.path / SECRETS).unlink(missing_ok=True)


def ended(rd: RunDir, record: RunRecord, reason: str, requeue: bool, start: Start, rc: int) -> int:
    """A failed job's last word: requeued (Slurm starts it again, from its checkpoint) or failed, for ``reason``."""
    if requeue:
        record.state = QUEUED
        record.reason = f"requeued after: {reason} (restart {start.restarts + 1} of {start.max_restarts})"
        write_record(rd, record)
        slurm_recovery.note(rd, f"{slurm_recovery.RESTART} {start.restarts + 1} of {start.max_restarts}: {reason}")
        put_secrets_back(rd, start.secrets)
        subprocess.run(["scontrol", "requeue", start.job_id], check=False)  # noqa: S607 - Slurm ends this step now
        return rc
    record.state, record.reason = FAILED, reason
    write_record(rd, record)
    final(rd)
    return rc


def stalled(rd: RunDir, record: RunRecord, stall: Stall, on_stall: OnStall, start: Start, rc: int) -> int:
    """The end of a job its watchdog stopped (``on_stall`` fail or restart): requeued when asked to restart and
    requeues are left, else failed with ``stalled: <summary>``, the first odd rank named as the failing one."""
    first = stall.diagnosis.first_odd
    node, rank = first if first else (None, None)
    try:
        record.failed_node = check_node_name(node) if node else None
    except ValueError:
        record.failed_node = None
    record.failed_rank, record.failed_at, record.error_tail = rank, stall.at, []
    requeue = on_stall == OnStall.RESTART and start.restarts < start.max_restarts and bool(start.job_id)
    return ended(rd, record, stall.reason, requeue, start, rc or 1)


def lost(rd: RunDir, record: RunRecord, gone: dict[str, str], start: Start, rc: int) -> int:
    """Nodes of the allocation are lost (``node -> why``): the job requeued without them while recoveries are
    left (with ``min_nodes``, on as few as that), else the run failed naming every loss."""
    names = list(gone)
    record.failed_node, record.failed_rank, record.failed_at = names[0], None, now()
    why = "; ".join(f"{n}: {w}" for n, w in gone.items())
    record.error_tail = [f"lost {why}"[:500]]
    before = [n for n in record.lost if n not in names]
    record.lost = [*before, *names]
    if start.may_recover:
        k, most = start.recoveries + 1, start.spec.max_recoveries
        record.state = QUEUED
        record.reason = (f"{', '.join(names)} lost: requeued without {'it' if len(names) == 1 else 'them'} "
                         f"(recovery {k} of {most})")
        write_record(rd, record)
        slurm_recovery.note(rd, f"{slurm_recovery.RECOVERY} {k}: {', '.join(names)} lost", names)
        put_secrets_back(rd, start.secrets)
        size = len(start.hosts)
        shrink = f"{start.spec.min_nodes}-{size}" if 0 < start.spec.min_nodes < size else None
        exclude = [*slurm_recovery.excluded(start.job_id), *record.lost]
        print(f"higgsfield: {record.reason}", flush=True)
        slurm_recovery.requeue_without(start.job_id, exclude, shrink)
        return rc or 1
    record.state = FAILED
    record.reason = (f"{', '.join(names)} lost, no recovery left (--max-recoveries {start.spec.max_recoveries})"
                     + (f"; lost before: {', '.join(before)}" if before else ""))
    write_record(rd, record)
    final(rd)
    return rc or 1


def failure(rd: RunDir, hosts: list[str], nproc: int, rc: int, since: float) -> Failure:
    """The run's first failure: :func:`describe`'s rank and reason, with the node that rank ran on.

    Group ranks follow the sorted host names (torch's c10d rendezvous sorts its
    participants, each named by its ``--local_addr``), so global rank r ran on
    ``sorted(hosts)[r // nproc]`` (:func:`higgsfield.contract.layout.node_of_rank`). A failure without a rank (a whole torchrun died) is
    named by srun's own line ``srun: error: NODE: task T: ...``.
    """
    fail = describe(rd, "", rc, since)
    reason = fail.reason
    node = node_of_rank(hosts, nproc, fail.rank) if fail.rank is not None else None
    if node is None:
        text = read_end(rd.launcher_log, 64 * 1024)
        found = _SRUN_TASK_ERROR.findall(text)
        if found:
            node = found[0][0]
            reason = f"{reason} ({found[0][2].strip()})"
    if node:
        reason = f"{reason} on node {node}"
    return replace(fail, node=node, reason=reason)

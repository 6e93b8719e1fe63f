"""A Slurm run that loses a node goes on: Slurm starts the job again without it, and it resumes from its checkpoint.

An SSH run's nodes agree among themselves on a new node set (:mod:`higgsfield.node.gang.recovery`).
A Slurm job has a scheduler for that: a job submitted with ``--requeue`` is started again by
Slurm on the nodes it then allocates, and the run resumes from its last complete checkpoint,
which lives in the shared workdir. What this module adds is the judgement and the record:

- **A loss the batch step finds** (its own node is alive). When the job's ``srun`` step ends
  failed, every node of the allocation is asked to start a trivial step (``srun --overlap
  --jobid JOB -w NODE true``, all at once). A node whose slurmd starts none within
  :data:`PROBE_S`, or that Slurm already shows not responding or down, is lost; the batch
  step's own node answering is the control (when it does not, nothing is concluded). A rank
  that crashed on a healthy node is no loss: ``--max-restarts`` is for that. With recoveries
  left (``max_recoveries``) the batch step requeues the job (``scontrol requeue``) and, as soon
  as Slurm holds it pending again, excludes every node the run lost (``scontrol update
  ExcNodeList=...``; with ``--min-nodes``, ``NumNodes=MIN-N`` too, so a smaller allocation will
  do). Slurm keeps a down node out by itself; the exclusion keeps it out of this run once it
  comes back.
- **A loss Slurm finds** (the batch step's node itself died, so nothing of the job could say
  so). Slurm ends the job with NODE_FAIL and, the job being requeue-able, starts it again
  itself, once its slurmctld has declared the node down (``SlurmdTimeout``). The new start
  sees a requeue it did not ask for (no :class:`Requeue` note) and names as lost the previous
  attempt's nodes that Slurm shows down or not responding.

Either way the new start is an attempt of the run's record (``attempts``, ``lost``: what
``status`` and ``status --json``'s ``recoveries`` show, as for an SSH run). Past
``max_recoveries`` the run fails, its one line naming every loss. Between the two starts the
run's secrets stay in their 0600 file (:func:`higgsfield.node.slurm_run.put_secrets_back`):
a start Slurm makes by itself needs them too.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.decode import DecodeError, read_json
from higgsfield.node.state.records import Attempt, RunDir, RunRecord, write_json

PROBE_S = 15.0          # a node whose slurmd starts no step in this long is lost
EXCLUDE_WAIT_S = 20.0   # how long the batch step tries to exclude the lost nodes once the job is requeued
REQUEUE_NOTE = "requeue.json"
FIRST = "first start"
RESTART = "restart"     # an attempt's ``why`` begins with it: the job requeued itself after a failure or a stall
RECOVERY = "recovery"   # ... with this: it went on without a lost node (``lost`` names it)
SLURM_REQUEUED = "requeued by Slurm"
_GONE = frozenset({"DOWN", "FAIL", "FAILING", "NO_RESPOND", "NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN",
                   "UNKNOWN"})


@dataclass(frozen=True)
class Requeue:
    """``requeue.json``: why the batch step requeued the job, for the start that follows (which deletes it)."""

    WHAT: ClassVar[str] = "requeue note"

    why: str
    lost: list[str] = field(default_factory=list)


# -- the attempts -------------------------------------------------------------------------------

def restarts(attempts: Sequence[Attempt]) -> int:
    """How many times the run was requeued after a failure or a stall (``--max-restarts`` counts these)."""
    return sum(1 for a in attempts if a.why.startswith(RESTART))


def recoveries(attempts: Sequence[Attempt]) -> int:
    """How many times the run went on without a lost node (``--max-recoveries`` counts these)."""
    return sum(1 for a in attempts if a.lost)


def note(rd: RunDir, why: str, lost: Sequence[str] = ()) -> None:
    """Leave the next start the reason of this requeue (see :class:`Requeue`)."""
    write_json(rd.path / REQUEUE_NOTE, encode(Requeue(why=why, lost=list(lost))))


def _take_note(rd: RunDir) -> Requeue | None:
    path = rd.path / REQUEUE_NOTE
    try:
        return decode(Requeue, read_json(path, root=rd.home.root))
    except (OSError, DecodeError):
        return None
    finally:
        path.unlink(missing_ok=True)


def begin(rd: RunDir, previous: RunRecord | None, hosts: Sequence[str], restart_count: int) -> Attempt:
    """This start of the job as an attempt of the run (``restart_count``: ``SLURM_RESTART_COUNT``)."""
    told = _take_note(rd)
    earlier = previous.attempts if previous is not None else []
    if restart_count == 0 or previous is None:
        why, lost = FIRST, []
    elif told is not None:
        why, lost = told.why, list(told.lost)
    else:   # Slurm started it again by itself: its batch node was lost (NODE_FAIL), or it was preempted
        before = earlier[-1].nodes if earlier else [previous.node]
        lost = sorted(n for n in gone(before) if n not in hosts)
        why = f"{RECOVERY} {recoveries(earlier) + 1}: {', '.join(lost)} lost" if lost else SLURM_REQUEUED
    return Attempt(number=len(earlier) + 1, at=time.time(), nodes=list(hosts), why=why, logs=rd.log_sizes(),
                   lost=lost)


# -- which nodes are lost -----------------------------------------------------------------------

def gone(nodes: Sequence[str]) -> list[str]:
    """The ``nodes`` Slurm shows down, failed or not responding (``sinfo``'s ``*`` mark), in their order."""
    if not nodes:
        return []
    try:
        r = subprocess.run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %T"],  # noqa: S607
                           capture_output=True, text=True, timeout=30, env=_outside_env(), check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    states: dict[str, str] = {}
    for line in r.stdout.splitlines():
        name, _, state = line.strip().partition(" ")
        states[name] = state.strip()
    return [n for n in nodes if n in states and _is_gone(states[n])]


def _is_gone(state: str) -> bool:
    """``down``, ``fail``... or any state with sinfo's ``*`` (the node does not answer slurmctld)."""
    base = state.strip().rstrip("*~#!%$@^-+").upper()
    return state.strip().endswith("*") or base in _GONE


def probe(job_id: str, nodes: Sequence[str], timeout: float = PROBE_S) -> dict[str, str]:
    """``node -> why`` for each of ``nodes`` whose slurmd started no step of the job within ``timeout`` (at once)."""
    procs = {}
    for n in nodes:
        argv = ["timeout", "-k", "2", f"{timeout:g}", "srun", "--overlap", f"--jobid={job_id}", "-N1", "-n1",
                f"--nodelist={n}", "--quiet", "true"]
        try:
            procs[n] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,  # noqa: S603
                                        env=_outside_env())
        except OSError:   # no srun here: nothing can be told
            for started in procs.values():
                started.kill()
            return {}
    out = {}
    for n, p in procs.items():
        try:
            _, err = p.communicate(timeout=timeout + 5)
        except subprocess.TimeoutExpired:
            p.kill()
            err = b"no answer"
        if p.returncode != 0:
            lines = [ln for ln in err.decode(errors="replace").splitlines() if ln.strip()]
            out[n] = lines[-1].strip()[:200] if lines else f"timed out after {timeout:g}s"
    return out


def lost_nodes(job_id: str, hosts: Sequence[str], me: str) -> dict[str, str]:
    """The allocation's nodes that are lost (``node -> why``): see the module. Empty when none is, or when the
    batch step's own node (``me``) does not answer either (then it cannot tell a lost node from a dying job)."""
    if not job_id or len(hosts) < 2:
        return {}
    silent = probe(job_id, hosts)
    if me in silent:
        return {}
    for n in gone(hosts):
        silent.setdefault(n, "Slurm shows it down or not responding")
    return {n: silent[n] for n in hosts if n in silent}


# -- the requeue without them -------------------------------------------------------------------

def requeue_without(job_id: str, exclude: Sequence[str], nodes: str | None = None,
                    wait: float = EXCLUDE_WAIT_S) -> bool:
    """Requeue the job, then exclude ``exclude`` (and ask for ``nodes``, ``MIN-MAX``) once Slurm holds it pending:
    True when the exclusion took. Slurm ends this step meanwhile (SIGTERM, SIGKILL after its KillWait); a step
    killed before the exclusion took leaves the job requeued all the same (a down node is not allocated)."""
    env = _outside_env()
    subprocess.run(["scontrol", "requeue", job_id], check=False, env=env, capture_output=True)  # noqa: S607
    update = ["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(sorted(set(exclude)))}"]
    if nodes:
        update.append(f"NumNodes={nodes}")
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        r = subprocess.run(update, check=False, env=env, capture_output=True, timeout=30)  # noqa: S603
        if r.returncode == 0:
            return True
        time.sleep(0.2)
    return False


def excluded(job_id: str) -> list[str]:
    """The nodes the job already excludes (``run --exclude``, earlier recoveries): ``scontrol show job``'s."""
    try:
        r = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,  # noqa: S607
                           timeout=30, env=_outside_env(), check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    for word in r.stdout.split():
        key, _, value = word.partition("=")
        if key == "ExcNodeList" and value not in ("", "(null)"):
            try:
                out = subprocess.run(["scontrol", "show", "hostnames", value], capture_output=True,  # noqa: S607
                                     text=True, timeout=30, env=_outside_env(), check=False).stdout
            except (OSError, subprocess.TimeoutExpired):
                return value.split(",")
            return out.split()
    return []


def _outside_env() -> dict[str, str]:
    """The job's environment less Slurm's own variables (an ``srun`` inside the job would take them as its own)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}

"""The stall watchdog of a Slurm run: in its batch step, over every rank of the allocation, laptop or not.

An SSH run's nodes agree on a stall through the run's coordinator
(:mod:`higgsfield.node.gang.coordinator`). A Slurm run needs no wire for it: its run
directory is in the shared workdir, where every rank of every node writes its progress
(``progress/rank<N>``, :func:`higgsfield.training.progress`) and its log. So the batch
step, on the allocation's first node, is the one judge: about once a second it reads the
run's newest progress (:func:`higgsfield.node.runs.progress.latest`) into a
:class:`~higgsfield.node.gang.watchdog.Watchdog` (``startup_timeout`` until the first
progress, ``stall_timeout`` after), so there is one verdict and one time for the whole job.

At a stall it takes every rank's stack the way ``higgsfield stacks`` does from the login
node: one more step inside the job's own allocation, ``srun --overlap --jobid JOB``, whose
task on each node (``python -m higgsfield.node.slurm_task stacks RUN_DIR``) signals that
node's ranks (their faulthandlers dump, no ptrace needed) and prints them as one JSON line.
It saves them all in the run's ``stacks.json``, diagnoses them
(:func:`higgsfield.contract.stacks.diagnose`), keeps the diagnosis in the run's record
(``stall``, ``stalled_at``) and then, per ``on_stall``:

- ``fail``: the job's step is stopped, and the run ends ``failed`` with the reason
  ``stalled: <summary>`` naming the odd ranks ``node/rank`` (:mod:`higgsfield.node.slurm_task`
  writes the end): the nodes go back to Slurm within seconds;
- ``restart``: the same, then the job is requeued (as after a crash: counted against
  ``max_restarts``; the workers resume from the checkpoint in the shared workdir); with no
  requeue left it fails as above. (A Slurm run's torchrun has no restarts of its own: the
  requeue is how it restarts.)
- ``wait``: the record says ``stalled`` (with the diagnosis) while Slurm runs the job, and
  ``running`` again once a rank progresses.

The same loop names a straggler (:meth:`StallWatch.judge`): every rank's own work per step is in
the shared run directory too, so the batch step applies an SSH run's straggler rule to all of
them and keeps the finding in the record (``stragglers``), whatever ``on_stall`` says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from higgsfield.contract.codec import encode
from higgsfield.contract.layout import node_of_rank, ranks_of_node
from higgsfield.contract.runspec import RunSpec
from higgsfield.contract.slurm_stacks import SRUN_WAIT_S, NodeStacks, parse_srun, srun_argv
from higgsfield.contract.stacks import Diagnosis, RankStacks, diagnose
from higgsfield.contract.stall_policy import OnStall, StallPolicy
from higgsfield.contract.states import RUNNING, STALLED
from higgsfield.node.gang.stragglers import StragglerRule
from higgsfield.node.gang.watchdog import Watchdog
from higgsfield.node.runs import progress, stacks
from higgsfield.node.state import records
from higgsfield.node.state.placement import read_run_spec
from higgsfield.node.state.records import RunDir

POLL_S = 1.0          # how often the batch step looks at the run's progress
KILL_AFTER_S = 30.0   # srun told to end the stalled step and still there after this: killed




def node_stacks(rd: RunDir, node: str) -> str:
    """The ``stacks`` task's one line: this node's ranks' stacks (``{"node", "ranks"}``) or why not (``"error"``)."""
    try:
        pinned = read_run_spec(rd.spec_path)
        found = stacks.take(rd, node, ranks=ranks_of_node(pinned.nodes, pinned.nproc or 1, node))
    except Exception as e:  # noqa: BLE001 - one node's failure is a line, the other nodes still answer
        return json.dumps(encode(NodeStacks(node, error=f"{type(e).__name__}: {e}")))
    return json.dumps(encode(NodeStacks(node, ranks=found)))






def take_all(job_id: str, hosts: Sequence[str], python: str, rd: RunDir) -> tuple[list[RankStacks], dict[str, str]]:
    """Every rank's stack in the job, through ``srun --overlap`` (see the module's docstring)."""
    argv = srun_argv(job_id, len(hosts), python, str(rd.path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k in ("SLURM_CONF",)}
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=SRUN_WAIT_S + 5, env=env,  # noqa: S603
                           check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], {h: f"srun --overlap: {e}" for h in hosts}
    return parse_srun(r.stdout, hosts)


@dataclass
class Stall:
    """A stall found: when, every rank's stack at it, what they say, the nodes that gave none."""

    at: float
    diagnosis: Diagnosis
    stacks: list[RankStacks] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)

    @property
    def reason(self) -> str:
        """``stalled: <summary>``: a failed-by-stall run's reason."""
        gone = "; ".join(f"{n}: {w}" for n, w in sorted(self.missing.items()))
        return f"stalled: {self.diagnosis.summary}" + (f" (no stacks from {gone})" if gone else "")


Taker = Callable[[], tuple[list[RankStacks], dict[str, str]]]


class StallWatch:
    """The batch step's watchdog over the whole job; :meth:`tick` about once a second while the step runs."""

    def __init__(self, rd: RunDir, spec: RunSpec, started_at: float, take: Taker) -> None:
        self.rd, self.spec, self.take = rd, spec, take
        self.policy = StallPolicy.from_spec(spec)
        self.dog = Watchdog(self.policy.stall_timeout, self.policy.startup_timeout, started_at)
        self.stall: Stall | None = None   # the stall now (on_stall=wait: until a rank progresses again)
        self.stragglers = StragglerRule()  # the slow rank, named by its own work per step

    @property
    def on(self) -> bool:
        return not self.policy.off

    def tick(self, now: float) -> str | None:
        """``"stalled"`` when a stall begins (its stacks taken and saved, :attr:`stall` set), ``"progressing"``
        when a rank progresses after one; None otherwise."""
        latest = progress.latest(self.rd)
        if latest is not None:
            self.dog.progress("job", latest.at)
        stuck = self.dog.stalled(now)
        if stuck and self.stall is None:
            found, missing = self.take()
            if found:
                stacks.save(self.rd, found)
            self.stall = Stall(at=now, diagnosis=diagnose(found), stacks=found, missing=missing)
            records.stalled(self.rd, self.stall.diagnosis, now)
            return "stalled"
        if not stuck and self.stall is not None:
            self.stall = None
            return "progressing"
        return None

    def judge(self, now: float) -> None:
        """Every rank's own work per step (``progress/work<N>`` in the shared run directory) judged by the straggler
        rule, as an SSH run's coordinator judges it (:mod:`higgsfield.node.gang.stragglers`); a change of the ranks
        named is kept in the record (``stragglers``: ``status``, the dashboard) and said in the job's log."""
        nodes, nproc = self.spec.nodes, self.spec.nproc or 1
        work = [replace(w, node=node_of_rank(nodes, nproc, w.rank) or "") for w in progress.work(self.rd)]
        if work and self.stragglers.report(work, now):
            found = self.stragglers.findings()
            record = self.rd.read()
            record.stragglers = list(found)
            self.rd.write(record)
            print("higgsfield: stragglers: " + ("; ".join(s.summary for s in found) if found else "none now"),
                  file=sys.stderr, flush=True)

    def mark(self, state: str, reason: str | None) -> None:
        """The record's state while the job runs on (``on_stall: wait``): ``stalled`` or ``running`` again."""
        record = self.rd.read()
        record.state, record.reason = state, reason
        self.rd.write(record)


def watch(proc: subprocess.Popen[bytes], watcher: StallWatch, *, stop: Callable[[], None],
          running_reason: str | None, clock: Callable[[], float] = time.time, poll: float = POLL_S) -> Stall | None:
    """Wait for the job's step ``proc``; while it runs, tick ``watcher``. Returns the stall that ended it
    (``on_stall`` fail or restart: ``stop()`` was called), or None (it ended by itself, or was killed)."""
    verdict: Stall | None = None
    stopped_at = 0.0
    while True:
        try:
            proc.wait(timeout=poll)
            return verdict
        except subprocess.TimeoutExpired:
            pass
        if verdict is not None:
            if time.monotonic() - stopped_at > KILL_AFTER_S:
                proc.kill()   # srun did not end its step when told: the nodes must go back to Slurm
            continue
        try:
            watcher.judge(clock())
        except Exception as e:  # noqa: BLE001 - nor does the straggler rule
            print(f"higgsfield: straggler rule: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        if not watcher.on:
            continue
        try:
            news = watcher.tick(clock())
        except Exception as e:  # noqa: BLE001 - the watchdog never takes the job's end down with it
            print(f"higgsfield: stall watchdog: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            continue
        if news == "stalled" and watcher.stall is not None:
            stall = watcher.stall
            print(f"higgsfield: {stall.reason} (on_stall: {watcher.policy.on_stall})", file=sys.stderr, flush=True)
            if watcher.policy.on_stall == OnStall.WAIT:
                watcher.mark(STALLED, stall.reason)
            else:
                verdict, stopped_at = stall, time.monotonic()
                stop()
        elif news == "progressing":
            print("higgsfield: the run progresses again", file=sys.stderr, flush=True)
            watcher.mark(RUNNING, running_reason)

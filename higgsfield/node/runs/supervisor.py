"""A run's supervisor on one node: gang admission, torchrun, fail fast, the final record.

``higgsfield invoker start`` (:func:`higgsfield.node.runs.start.start_run`) checks the
run, records it and starts this detached process, which owns the run on its node
until it ends, with or without the control side (a kill from the node's CLI is
:mod:`higgsfield.node.runs.stop`):

1. it joins the run's coordinator (:mod:`higgsfield.node.gang.coordinator`; node 0's
   supervisor hosts it on the port its start bound) with the run's token, read from
   its stdin with the secrets;
2. it waits in the node's queue (state ``queued``) until it holds its slots, says
   ``admitted``, and commits them when every node is admitted; on ``go`` (the
   rendezvous port, chosen by node 0) it starts torchrun: in a container
   (:class:`~higgsfield.node.runtime.containers.ContainerRun`) with the Docker runtime,
   as a process of its own session (:class:`~higgsfield.node.runtime.torchrun.ProcessRun`)
   otherwise;
3. while torchrun runs it watches for a kill (the ``kill`` marker, SIGTERM) and for
   the coordinator's ``abort`` (another node failed, was killed or was lost) or the
   coordinator itself vanishing (node 0 lost): it stops torchrun at once (SIGTERM,
   SIGKILL after a short grace) so no node waits for the others in torchrun's
   300 s exit barrier;
4. while torchrun runs it also reports its ranks' progress to the coordinator (about
   once a second, when it advanced: :mod:`higgsfield.node.runs.progress`), and
   answers the coordinator's stall watchdog: on ``stall`` it takes its ranks'
   stacks (:mod:`higgsfield.node.runs.stacks`), keeps them in ``stacks.json`` and
   sends them; on ``stalled`` it keeps the diagnosis in the record (and with
   ``on_stall=wait`` sets the state ``stalled``, ``running`` again on
   ``progressing``); on ``restart`` it kills its workers, which torchrun restarts;
5. when torchrun ends non-zero it reports the failure (node, rank, when, reason,
   the last lines of the rank's error: :mod:`higgsfield.node.runs.failure`), waits
   a moment for the coordinator's verdict (the run's *first* failure, the same on
   every node), writes the final record, then releases its slots;
6. unless the coordinator answers with ``regroup`` (a node was lost and the run goes on
   without it: :mod:`higgsfield.node.gang.recovery`): then it takes the new node set as
   a new attempt (:mod:`higgsfield.node.runs.regroup`) and goes back to step 2.

Its umask is 0077: what the run writes on the node is private to the node user.
"""

from __future__ import annotations

import os
import queue as _queue
import signal
import sys
import threading
import time
from typing import Any

from higgsfield.contract.errors import RunError
from higgsfield.contract.failure import Failure, Verdict
from higgsfield.contract.gang import (
    Abort,
    Admission,
    Admitted,
    Bye,
    Cancel,
    Failed,
    Finished,
    Go,
    Killed,
    Message,
    Prepare,
    Ready,
    Stopped,
    Unadmitted,
)
from higgsfield.contract.notify import Event, Notify
from higgsfield.contract.stall_policy import StallPolicy
from higgsfield.contract.states import FAILED, KILLED, QUEUED, RUNNING, SUCCEEDED
from higgsfield.node.gang import queue, wire
from higgsfield.node.gang.coordinator import Coordinator, lost_failure
from higgsfield.node.gang.listener import listen
from higgsfield.node.gang.member import Inbox, Lost, Member
from higgsfield.node.gang.recovery import REGROUP_WAIT_S
from higgsfield.node.runs import failure, progress, regroup, stragglers
from higgsfield.node.runs.notify import Note, Notifier, tell_end
from higgsfield.node.runs.outcome import REGROUP, Outcome, say
from higgsfield.node.runs.stall_answer import StallAnswers
from higgsfield.node.runs.succession import Succession
from higgsfield.node.runs.watch import watch
from higgsfield.node.runtime import torchrun
from higgsfield.node.state import pids
from higgsfield.node.state.placement import NodeRun
from higgsfield.node.state.records import RunDir, finish

JOIN_S = 120.0          # how long a supervisor tries to reach its run's coordinator
VERDICT_WAIT_S = 3.0    # how long a node that stopped waits for the coordinator's verdict
DONE_WAIT_S = 60.0      # node 0: how long its coordinator waits for the other nodes' last word

class Supervisor:
    def __init__(self, rd: RunDir, run: NodeRun, secrets: dict[str, str], token: str,
                 listener: Any = None, notify: Notify | None = None) -> None:
        spec = run.spec
        self.home, self.rd, self.node_run = rd.home, rd, run
        self.secrets, self.token = secrets, token
        # node 0 is given destinations (every node, when the run recovers: node 0 may be lost); node 0 sends
        self.notifier = Notifier(notify or Notify(), say, speaks=lambda: self.node_run.spec.node_rank == 0)
        self.node = spec.node
        self.verdict_wait = VERDICT_WAIT_S + (REGROUP_WAIT_S if spec.recovers else 0.0)   # a regroup waits for all
        self.nodes = list(spec.nodes)
        self.inbox: Inbox = _queue.Queue()
        self.stop_asked = threading.Event()
        self.cap = queue.capacity(run.placement.gpus)
        self.entry = queue.Entry(project=spec.project, run=spec.run,
                                 want=queue.wanted(run.nproc, spec.exclusive, self.cap), exclusive=spec.exclusive,
                                 order=spec.submitted_at, pid=os.getpid(), pid_start=pids.start_time(os.getpid()))
        self.coordinator: Coordinator | None = None
        self.recovering = 0   # the recovery whose attempt starts next (its start is told as 'recovered')
        # every other node of a run that recovers holds a port to host the coordinator on, should node 0 be lost
        self.succession = Succession(spec, listen(queue.reserved_ports(rd.home))
                                     if listener is None and spec.recovers and spec.addresses else None)
        if listener is not None:  # node 0 hosts the coordinator and reaches it on the loopback
            self.coordinator = Coordinator(listener, token=token, run=spec.run, nodes=list(spec.members),
                                           pick_port=lambda: queue.reserve_port(rd.home, self.entry.key), say=say,
                                           stall=StallPolicy.from_spec(spec), max_restarts=spec.max_restarts,
                                           min_nodes=spec.min_nodes if spec.recovers else 0,
                                           max_recoveries=spec.max_recoveries, spares=len(spec.spares),
                                           on_straggler=spec.on_straggler)
            host, port = "127.0.0.1", run.placement.coord_port or 0
        else:
            host, port = (spec.coordinator.host, spec.coordinator.port) if spec.coordinator else ("", 0)
        self.member = Member(host, port, token=token, run=spec.run, rank=spec.node_rank, node=self.node,
                             coordinator_node=self.nodes[0], inbox=self.inbox, say=say)
        self.answers = StallAnswers(rd, self.node, send=lambda m: self.member.send(m), on_stall=lambda: self.node_run.spec.on_stall,
                                    word=lambda d: self.notifier.event(self._note("stalled", detail=d)),
                                    set_state=self._set_state)

    # -- life ----------------------------------------------------------------------------------------

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        if self.coordinator is not None:
            self.coordinator.start()
        try:
            outcome = self._life()
        except Exception as e:  # noqa: BLE001 - whatever broke, the record says so and the slots go
            say(f"supervisor error: {type(e).__name__}: {e}")
            outcome = Outcome(FAILED, None, self._own_failure(f"the supervisor failed: {e}"))
        finish(self.rd, outcome.state, outcome.rc, outcome.failure)
        queue.release(self.home, *self.entry.key)
        if self.coordinator is not None:  # node 0 serves the others until each has said its last word
            self.coordinator.wait(DONE_WAIT_S)
            tell_end(self.notifier, self._note, outcome.state, outcome.failure, self.coordinator.verdict)
            self.coordinator.close()
        self.member.close()
        self.notifier.close()
        return 0

    def _note(self, event: Event, **fields: Any) -> Note:
        spec = self.node_run.spec
        return Note(event, spec.run, spec.project, spec.experiment, step=progress.newest_step(self.rd), **fields)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.stop_asked.set()
        self.inbox.put(None)    # wake up: look at the stop flag now

    def _stopping(self) -> bool:
        return self.stop_asked.is_set() or self.rd.kill_marker.exists()

    def _next(self, timeout: float) -> Message | Lost | None:
        try:
            return self.inbox.get(timeout=timeout)
        except _queue.Empty:
            return None

    def _life(self) -> Outcome:
        if self._stopping():
            return Outcome(KILLED)
        try:
            self.member.connect(time.monotonic() + JOIN_S, should_stop=self._stopping)
        except wire.WireError as e:
            if self._stopping():
                return Outcome(KILLED)
            say(str(e))
            return Outcome(FAILED, None, lost_failure(self.nodes[0], str(e), time.time()))
        self.member.start()
        self.succession.offer(self.member)
        while True:   # one attempt per pass; another only after a lost node (a regroup)
            admitted = self._admit()
            outcome = admitted if isinstance(admitted, Outcome) else self._run(*admitted)
            while outcome.state == REGROUP and not self._regroup():
                if self.node in self.succession.history.lost:   # put out as a straggler: its part ends here
                    return Outcome(FAILED, None, self._own_failure("put out of the run for a spare: a straggler"))
                outcome = self._standby()   # a spare still: another one took the lost node's place
            if outcome.state != REGROUP:
                return outcome

    def _regroup(self) -> bool:
        """The next attempt, on the nodes the coordinator's ``regroup`` names (:mod:`higgsfield.node.runs.regroup`);
        False when this node is a spare that stays one."""
        msg = self.member.regroup
        assert msg is not None
        self.member.regroup, self.member.verdict = None, None
        self.member.verdict_final.clear()
        regroup.drop_stale(self.inbox, msg)   # what came before it (an abort...) ended the last attempt
        before = self.succession.history.lost
        self.succession.regrouped(msg)
        if self.node not in msg.nodes:
            return False
        self.node_run, self.nodes = regroup.take(self.rd, self.node_run, msg), list(msg.nodes)
        say(f"recovery {msg.recovery}: {', '.join(msg.lost)} lost; going on on {', '.join(msg.nodes)}")
        for gone in (n for n in msg.lost if n not in before):   # node 0 of the new attempt tells (the others: no)
            self.notifier.event(self._note("lost", node=gone, detail=f"the run goes on on {', '.join(msg.nodes)}"))
        self.recovering = msg.recovery   # the next torchrun's start is the run recovered
        return True

    def _standby(self) -> Outcome:
        """A spare holds its slots until a lost node's place is its own (a regroup naming it) or the run ends."""
        while not self._stopping():
            msg = self._next(0.5)
            if self.member.regroup is not None:
                return Outcome(REGROUP)
            if isinstance(msg, (Abort, Lost)):
                return self._ended_elsewhere(msg, last=None)
            if isinstance(msg, Bye):   # the run ended well without it
                return Outcome(SUCCEEDED)
        self.member.send(Killed())
        return Outcome(KILLED)

    # -- gang admission --------------------------------------------------------------------------------

    def _admit(self) -> tuple[list[int], int] | Outcome:
        """Queue here, say admitted, commit on prepare: (slots, port) on go; an Outcome if it ended first."""
        state, slots = Admission.WAITING, None
        said_queued = said_gang = False
        while True:
            if self._stopping():
                self.member.send(Killed())
                return Outcome(KILLED)
            if state is Admission.WAITING:
                slots = queue.try_acquire(self.home, self.entry, self.cap)
                if slots is not None:
                    state = Admission.ADMITTED
                    self.member.send(Admitted())
                elif not said_queued:
                    holders = ", ".join(f"{e.run} ({len(e.slots or [])})" for e in queue.snapshot(self.home)
                                        if e.slots is not None and e.key != self.entry.key)
                    say(f"queued: wants {self.entry.want} of {self.cap.slots} {'GPU' if self.cap.gpus else 'CPU'} "
                        f"slot(s); held by: {holders or '-'}")
            elif state is Admission.ADMITTED:
                slots = queue.holds(self.home, self.entry, self.cap)
                if slots is None:  # an older run took them back: wait again
                    state = Admission.WAITING
                    self.member.send(Unadmitted())
                elif not said_gang and len(self.nodes) > 1:
                    said_gang = True
                    say("holds its slots; waiting for the run's other nodes")
            if not said_queued:  # in the queue now: queued until every node is admitted and says go
                said_queued = True
                self._set_state(QUEUED)
            msg = self._next(0.5)
            if isinstance(msg, (Abort, Lost)):
                self.member.send(Stopped())
                return self._ended_elsewhere(msg)
            if isinstance(msg, Prepare):
                if state is Admission.ADMITTED and queue.commit(self.home, self.entry.key):
                    state = Admission.READY
                    self.member.send(Ready())
                else:
                    state = Admission.WAITING
                    self.member.send(Unadmitted())
            elif isinstance(msg, Cancel) and state is Admission.READY:
                queue.uncommit(self.home, self.entry.key)
                state = Admission.ADMITTED
            elif isinstance(msg, Go) and state is Admission.READY and slots is not None:
                return slots, msg.port

    def _ended_elsewhere(self, msg: Abort | Lost, last: Message | None = Stopped()) -> Outcome:  # noqa: B008
        """The run ended on another node (or node 0 was lost) before or while this node ran it; ``last``: this
        node's last word, for the coordinator that takes over from a lost node 0 (:meth:`_take_over`)."""
        if isinstance(msg, Lost) and self._heir() is not None:
            return self._take_over(last)
        if not isinstance(msg, Lost):
            self.member.verdict_final.wait(self.verdict_wait)
        if self.member.regroup is not None:
            return Outcome(REGROUP)
        verdict: Verdict = self.member.verdict or msg.verdict
        if verdict.kind == "killed":
            return Outcome(KILLED)
        return Outcome(FAILED, None, verdict.failure or msg.verdict.failure)

    # -- running ---------------------------------------------------------------------------------------

    def _run(self, slots: list[int], port: int) -> Outcome:
        run = self.node_run
        if run.spec.spare:
            say(f"a spare of the run: holding its slots, standing by for a lost node of {', '.join(self.nodes)}")
            record = self.rd.read()
            record.slots = slots
            self.rd.write(record)
            return self._standby()
        gpu_ids = slots if self.cap.gpus else []   # CPU slots are a count, not devices
        command = torchrun.argv(run, self.rd, "python" if run.docker else (run.placement.python or sys.executable),
                                port)
        record = self.rd.read()
        record.slots, record.master_port, record.command = slots, port, command
        since = time.time()
        try:
            if run.docker:
                from higgsfield.node.runtime.containers import ContainerRun

                handle: Any = ContainerRun(run, self.rd, command, torchrun.container_env(run, self.rd),
                                           gpu_ids=gpu_ids, secrets=self.secrets)
            else:
                handle = torchrun.ProcessRun(command, self.rd, cwd=run.spec.code_dir,
                                             env=torchrun.process_env(run, self.rd, self.secrets, gpu_ids))
                pids.remember(record, "launcher", handle.pid)
        except (RunError, OSError) as e:
            say(str(e))
            return self._own_end(Outcome(FAILED, 1, self._own_failure(str(e))))
        record.state, record.started_at = RUNNING, time.time()
        self.rd.write(record)
        nodes = f"nodes: {', '.join(self.nodes)}"
        self.notifier.event(self._note("recovered", detail=f"recovery {self.recovering}: {nodes}") if self.recovering
                            else self._note("started", detail=nodes))
        self.recovering = 0
        rc, cause = self._watch(handle)
        code = rc if isinstance(rc, int) else None
        if self._stopping() or isinstance(cause, Killed):
            self.member.send(Killed())
            return Outcome(KILLED, code)
        if cause is not None and (first := self._failed_first(cause, code, since)) is not None:
            return self._own_end(Outcome(FAILED, failure.rank_code(self.rd, since) or code, first))
        if cause is not None:
            self.member.send(Stopped())
            outcome = self._ended_elsewhere(cause)
            outcome.rc = code
            return outcome
        if code == 0:
            self.member.send(Finished())
            return Outcome(SUCCEEDED, 0)
        if code is None:  # the Docker engine went away
            return self._own_end(Outcome(FAILED, 1, self._own_failure(str(rc))))
        # the run's exit code is the failing rank's own (1 for an exception), not torchrun's summary of it
        return self._own_end(Outcome(FAILED, failure.rank_code(self.rd, since) or code,
                                     failure.describe(self.rd, self.node, code, since)))

    def _failed_first(self, cause: Abort | Lost | Killed, code: int | None, since: float) -> Failure | None:
        if not isinstance(cause, Abort) or code in (None, 0):
            return None
        return failure.before(self.rd, self.node, code, since, cause.verdict.failure)

    def _watch(self, handle: Any) -> tuple[int | str, Abort | Lost | Killed | None]:
        """Watch torchrun (or its container) to its end: :func:`~higgsfield.node.runs.watch.watch`."""
        return watch(handle, self.rd, next_msg=self._next, send=lambda m: self.member.send(m),
                     answers=self.answers, stopping=self._stopping, stop_grace=self.node_run.placement.stop_grace,
                     straggling=lambda m: stragglers.noted(m, self.rd, self.notifier, self._note, say))

    def _own_end(self, outcome: Outcome) -> Outcome:
        """This node's part failed: report it, then take the coordinator's verdict (the run's first failure)."""
        say(f"failed: {outcome.failure.reason if outcome.failure else None}")
        self.member.send(Failed(outcome.failure))
        self.member.verdict_final.wait(self.verdict_wait)
        if self._heir() is not None:   # node 0 was lost (its ranks' loss failed this node's): its heir decides
            taken = self._take_over(Failed(outcome.failure))
            if taken.state == REGROUP or taken.failure is None:
                return taken
            outcome.failure = taken.failure
            return outcome
        if self.member.regroup is not None:
            return Outcome(REGROUP)
        verdict = self.member.verdict
        if verdict and verdict.kind == "failed" and verdict.failure:
            outcome.failure = verdict.failure
        return outcome

    # -- node 0 lost (:mod:`higgsfield.node.gang.takeover`) -------------------------------------------------

    def _heir(self) -> str | None:
        return self.succession.heir(self.member, self.node_run.spec, self.nodes, self._stopping())

    def _take_over(self, last: Message | None) -> Outcome:
        """Node 0 was lost: join its heir's coordinator (hosting it, when this node is the heir), give this node's
        last word, and take what it decides: a regroup, or the verdict (:mod:`higgsfield.node.runs.succession`)."""
        old = self.member
        joined = self.succession.join(old, self.node_run.spec, self.nodes, self.inbox, token=self.token,
                                      pick_port=lambda: queue.reserve_port(self.home, self.entry.key),
                                      stopping=self._stopping)
        if isinstance(joined, Outcome):
            return joined
        self.member, self.coordinator = joined[0], joined[1] or self.coordinator
        if last is not None:
            self.member.send(last)
        assert old.verdict is not None   # the lost coordinator's: what the run ends with if the heir says nothing
        return self._standby() if self.node_run.spec.spare else self._ended_elsewhere(Abort.of(old.verdict))

    def _own_failure(self, reason: str) -> Failure:
        return Failure(self.node, None, time.time(), reason)

    def _set_state(self, state: str) -> None:
        record = self.rd.read()
        record.state = state
        self.rd.write(record)

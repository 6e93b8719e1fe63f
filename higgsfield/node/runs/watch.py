"""A node's torchrun while it runs: its progress sent, the watchdog answered, a kill or an abort obeyed.

The supervisor (:mod:`higgsfield.node.runs.supervisor`) calls :func:`watch` once torchrun
started, and gets back how it ended and what stopped it. Its own module because this loop
is one concept (the part of a node's life when its ranks run) apart from admission before
it and the verdict after it:

- about once a second (:data:`PROGRESS_EVERY_S`) the ranks' progress is read and sent to
  the coordinator when it advanced (:mod:`higgsfield.node.runs.progress`);
- the watchdog's messages (``stall``, ``stalled``, ``progressing``, ``restart``) are
  answered (:class:`~higgsfield.node.runs.stall_answer.StallAnswers`); ``straggling`` is
  kept (:mod:`higgsfield.node.runs.stragglers`);
- a kill (the marker, SIGTERM) stops torchrun within the run's stop grace; an ``abort``
  or the coordinator lost stops it within :data:`ABORT_GRACE_S` (nothing to save: a peer
  is gone), SIGKILL a second after either grace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from higgsfield.contract.errors import RunError
from higgsfield.contract.gang import Abort, Killed, Message, Progress, Progressing, Restart, Stall, Stalled
from higgsfield.node.gang.member import Lost
from higgsfield.node.gang.wire import ABORT_GRACE_S
from higgsfield.node.runs import progress
from higgsfield.node.runs.outcome import say
from higgsfield.node.runs.stall_answer import StallAnswers
from higgsfield.node.state.records import RunDir

__all__ = ["ABORT_GRACE_S", "PROGRESS_EVERY_S", "watch"]

PROGRESS_EVERY_S = 1.0  # how often the run's progress on this node is read (and sent when it advanced)

Received = Message | Lost | None


def watch(handle: Any, rd: RunDir, *, next_msg: Callable[[float], Received], send: Callable[[Message], None],
          answers: StallAnswers, stopping: Callable[[], bool], stop_grace: float,
          straggling: Callable[[Received], Received]) -> tuple[int | str, Abort | Lost | Killed | None]:
    """Wait for torchrun (``handle``); stop it on a kill (Killed) or an abort. (exit code or engine error, the cause)."""
    cause: Abort | Lost | Killed | None = None
    stop_at = grace = 0.0
    hard = False
    sent_progress, read_progress = 0.0, 0.0
    try:
        while True:
            try:
                rc = handle.poll()
            except RunError as e:
                return str(e), cause
            if rc is not None:
                return rc, cause
            msg = straggling(next_msg(0.2))   # Straggling: kept in the record (and told, on node 0)
            if cause is None and time.monotonic() - read_progress >= PROGRESS_EVERY_S:
                read_progress = time.monotonic()
                p = progress.latest(rd)
                if p is not None and p.at > sent_progress:
                    sent_progress = p.at
                    send(Progress(at=p.at, steps=p.steps, work=p.work))
            if cause is None and isinstance(msg, (Stall, Stalled, Progressing, Restart)):
                answers.answer(msg)
                continue
            if cause is None:
                if stopping():
                    cause, grace = Killed(), stop_grace
                elif isinstance(msg, (Abort, Lost)):
                    cause, grace = msg, ABORT_GRACE_S
                    told = msg.verdict
                    say(f"stopping: {told.failure.reason if told.failure else told.kind}")
                if cause is not None:
                    handle.terminate(grace)
                    stop_at = time.monotonic()
            elif not hard and time.monotonic() - stop_at > grace + 1:
                hard = True
                handle.kill()
    finally:
        handle.cleanup()

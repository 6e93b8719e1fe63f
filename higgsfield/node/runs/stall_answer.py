"""A supervisor's answers to its coordinator's stall messages (:mod:`higgsfield.node.gang.stall`).

``stall``: take this node's ranks' stacks, keep them (``stacks.json``) and send them;
``stalled``: keep the diagnosis in the record (``on_stall=wait`` also sets the state
``stalled``) and send word; ``progressing``: ``running`` again; ``restart``: kill the
workers, which torchrun restarts. Its own module because these answers are one concept
apart from the supervisor's life; nothing here may stop the supervisor's watch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from higgsfield.contract.gang import Message, Progressing, Restart, Stacks, Stall, Stalled
from higgsfield.contract.stall_policy import OnStall
from higgsfield.contract.states import RUNNING, STALLED
from higgsfield.node.runs import stacks as rank_stacks
from higgsfield.node.runs.outcome import say
from higgsfield.node.state.records import RunDir, stalled

__all__ = ["StallAnswers"]


@dataclass
class StallAnswers:
    """One supervisor's answers: its run dir and node, and what it does for them (send, its spec's on_stall,
    word of a stall, its record's state)."""

    rd: RunDir
    node: str
    send: Callable[[Message], None]
    on_stall: Callable[[], str]
    word: Callable[[str], None]
    set_state: Callable[[str], None]

    def answer(self, msg: Stall | Stalled | Progressing | Restart) -> None:
        """The coordinator's stall messages (see the module doc); nothing here may stop the watch."""
        try:
            match msg:
                case Stall():
                    taken = rank_stacks.take(self.rd, self.node)
                    rank_stacks.save(self.rd, taken)
                    self.send(Stacks(tuple(taken)))
                case Stalled(diagnosis=d, at=at):
                    wait = self.on_stall() == OnStall.WAIT
                    stalled(self.rd, d, at, STALLED if wait else None)
                    say(f"stalled: {d.summary}")
                    self.word(f"{d.summary} (on_stall: {self.on_stall()})")
                case Progressing():
                    self.set_state(RUNNING)
                    say("progressing again")
                case Restart():
                    killed = rank_stacks.kill_workers(self.rd)
                    say(f"restarting the workers after the stall ({killed} killed)")
        except (OSError, ValueError) as e:
            say(f"stall handling ({msg.TAG}): {type(e).__name__}: {e}")

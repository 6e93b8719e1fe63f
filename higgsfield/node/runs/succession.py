"""This node's part when its run's node 0 is lost: its standby port, what it knows of the run, joining the heir.

The supervisor (:mod:`higgsfield.node.runs.supervisor`) of every node but node 0 of a run
that recovers holds a :class:`Succession`. It binds the standby port at the supervisor's
start and offers it to the coordinator after each join; it keeps the run's
:class:`~higgsfield.node.gang.takeover.History` (every regroup updates it); and when the
coordinator's connection is lost it names the heir and joins it, hosting the heir's
coordinator on the standby port when this node is the heir (the rule and why:
:mod:`higgsfield.node.gang.takeover`).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import replace

from higgsfield.contract.gang import Regroup, Standby
from higgsfield.contract.runspec import RunSpec
from higgsfield.contract.stall_policy import StallPolicy
from higgsfield.contract.states import FAILED, KILLED
from higgsfield.node.gang import takeover, wire
from higgsfield.node.gang.coordinator import Coordinator, lost_failure
from higgsfield.node.gang.member import Inbox, Member
from higgsfield.node.gang.recovery import REGROUP_WAIT_S
from higgsfield.node.runs.outcome import Outcome, say

__all__ = ["Succession"]


class Succession:
    def __init__(self, spec: RunSpec, standby: socket.socket | None) -> None:
        self.standby = standby   # None on node 0 (it hosts the coordinator) and in a run that does not recover
        self.history = takeover.History(gang=spec.members, nodes=spec.nodes, spares=spec.spares)

    def offer(self, member: Member) -> None:
        """Tell the coordinator where this node would host it."""
        if self.standby is not None:
            member.send(Standby(self.standby.getsockname()[1]))

    def regrouped(self, msg: Regroup) -> None:
        h = self.history
        self.history = replace(h, nodes=msg.nodes, lost=msg.lost, recovered=msg.recovery,
                               spares=tuple(n for n in h.spares if n not in msg.nodes + msg.lost))

    def heir(self, member: Member, spec: RunSpec, nodes: list[str], stopping: bool) -> str | None:
        """Who takes over the coordinator that ``member`` lost (node 0's: ``nodes[0]``); None: nobody, the run ends."""
        if not member.lost or not spec.recovers or stopping:
            return None
        heir = takeover.heir(nodes, nodes[0])
        if heir == spec.node:
            return heir if self.standby is not None else None
        return heir if heir in member.standbys and heir in spec.addresses else None

    def join(self, old: Member, spec: RunSpec, nodes: list[str], inbox: Inbox, *, token: str,
             pick_port: Callable[[], int], stopping: Callable[[], bool]) -> tuple[Member, Coordinator | None] | Outcome:
        """Join the heir's coordinator (started here first when this node is the heir): the new member, and the
        coordinator this node now hosts (if it does); an Outcome when the heir cannot be reached."""
        gone, heir = nodes[0], self.heir(old, spec, nodes, stopping())
        assert heir is not None
        old.close()
        while not inbox.empty():   # the lost coordinator's last messages are moot
            inbox.get_nowait()
        hosted = None
        if heir == spec.node:
            assert self.standby is not None
            listener, self.standby = self.standby, None
            hosted = takeover.coordinator(listener, self.history, gone, old.last_heard, token=token, run=spec.run,
                                          pick_port=pick_port, say=say, stall=StallPolicy.from_spec(spec),
                                          max_restarts=spec.max_restarts, min_nodes=spec.min_nodes,
                                          max_recoveries=spec.max_recoveries, on_straggler=spec.on_straggler)
            hosted.start()
            host, port = "127.0.0.1", listener.getsockname()[1]
        else:
            host, port = spec.addresses[heir], old.standbys[heir]
            say(f"node {gone}, which hosted the run's coordinator, was lost: joining {heir}, which takes it over")
        member = Member(host, port, token=token, run=spec.run, rank=old.rank, node=spec.node, coordinator_node=heir,
                        inbox=inbox, say=say)
        try:
            member.connect(time.monotonic() + REGROUP_WAIT_S, should_stop=stopping)
        except wire.WireError as e:
            if stopping():
                return Outcome(KILLED)
            return Outcome(FAILED, None, lost_failure(gone, f"the run's coordinator is gone, and {heir}, which was "
                                                            f"to take it over, cannot be reached ({e})", old.last_heard))
        member.start()
        self.offer(member)
        return member, hosted

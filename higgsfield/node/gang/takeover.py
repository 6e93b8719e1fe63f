"""A run whose node 0 is lost goes on: the next node hosts the coordinator, and the others join it there.

Node 0 hosts the run's coordinator (:mod:`higgsfield.node.gang.coordinator`), so losing it
ended the run on every node: each member's connection to it dropped. In a run that
recovers (``--min-nodes``, ``--spares``), every other member holds a port it bound when it
started, its *standby*, and tells the coordinator (:class:`~higgsfield.contract.gang.Standby`),
which tells everyone (:class:`~higgsfield.contract.gang.Standbys`). When node 0 goes, each
survivor stops its torchrun as before, then:

- the **heir**, the first node after the lost one in the run's node order, starts a
  coordinator on its standby port (:func:`coordinator`) that knows the run's history (its
  nodes, its spares standing by, the losses and recoveries so far) and counts node 0 lost;
- every survivor, the heir included (over the loopback), and every spare joins it at the
  heir's address (``RunSpec.addresses``) with the run's token and gives its last word; the
  coordinator's rule (:mod:`higgsfield.node.gang.recovery`) then regroups them as for any
  lost node. The heir is node 0 of the next attempt, so it hosts the rendezvous too, and
  its supervisor sends the run's ``notify:`` events from then on.

Why no election (Raft, etcd): the members agree on the order of the run's nodes and learned
the same standby ports from the one coordinator, so the heir is a pure function of what
every survivor already knows. A survivor that cannot reach the heir (lost with node 0)
ends the run with one line naming both, as a loss past ``min_nodes`` does. The standby
port speaks the same wire with the same token: no node-to-node shell, nothing new to trust.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from higgsfield.contract.gang import LastWord
from higgsfield.contract.stall_policy import StallPolicy
from higgsfield.node.gang.coordinator import Coordinator, lost_failure
from higgsfield.node.gang.recovery import REGROUP_WAIT_S

__all__ = ["History", "coordinator", "heir"]


def heir(nodes: Sequence[str], gone: str) -> str | None:
    """The node that takes the coordinator over from ``gone``: the first other node of the run (None: none left)."""
    left = [n for n in nodes if n != gone]
    return left[0] if left else None


@dataclass(frozen=True)
class History:
    """What every member knows of its run, enough to coordinate it from here on."""

    gang: tuple[str, ...]        # every member, by member rank (the run's nodes then its spares, at its start)
    nodes: tuple[str, ...]       # the run's nodes now, in node-rank order
    spares: tuple[str, ...]      # the spares still standing by
    lost: tuple[str, ...] = ()   # the nodes lost and recovered from so far
    recovered: int = 0           # the recoveries made so far


def coordinator(listener: socket.socket, history: History, gone: str, last_heard: float, *, token: str, run: str,
                pick_port: Callable[[], int], say: Callable[[str], None], stall: StallPolicy, max_restarts: int,
                min_nodes: int, max_recoveries: int, on_straggler: str = "warn") -> Coordinator:
    """The heir's coordinator for a run whose node 0 (``gone``, last heard of at ``last_heard``) was lost: it waits
    :data:`~higgsfield.node.gang.recovery.REGROUP_WAIT_S` for the survivors' last words, then regroups them (or
    gives the verdict). A node lost now or before can never join it."""
    c = Coordinator(listener, token=token, run=run, nodes=list(history.gang), pick_port=pick_port,
                    join_s=REGROUP_WAIT_S, say=say, stall=stall, max_restarts=max_restarts, min_nodes=min_nodes,
                    max_recoveries=max_recoveries, lost_before=history.lost, recovered=history.recovered,
                    on_straggler=on_straggler)
    rank = history.gang.index
    c.active = [rank(n) for n in history.nodes]
    c.spares = [rank(n) for n in history.spares]
    c.admission = c.active + c.spares
    for r, name in enumerate(history.gang):
        if r not in c.admission or name == gone:
            c.joined.add(r)             # never a member again
            c.final[r] = LastWord.LOST
    say(f"node {gone}, which hosted the run's coordinator, was lost: this node takes the coordinator over")
    c.fail_lost(lost_failure(gone, "the run's coordinator is gone", last_heard))
    return c

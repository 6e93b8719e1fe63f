"""Whether a run that lost nodes goes on without them, and on which: the coordinator's rule, as plain data.

Used by :class:`~higgsfield.node.gang.coordinator.Coordinator` when a run's first
failure settles. Its own module because the rule (what counts as a loss, how small
the run may get, how many times) is one concept, tested alone:

- only a **lost node** is recovered from: a node that died, froze or was cut off
  (its supervisor's connection dropped or went silent). A rank that crashed is a
  failure of the run's code, which ``--max-restarts`` retries on the same nodes;
- the survivors are the nodes that gave their last word (stopped or failed because
  their peers vanished). Node 0 is one of them while it hosts the coordinator; when it is
  the node lost, the next node took the coordinator over (:mod:`higgsfield.node.gang.takeover`)
  and the first survivor is the new node 0;
  a standing-by spare (admitted with the run, holding its slots) takes each lost node's place;
- the run goes on when at least ``min_nodes`` survive and fewer than
  ``max_recoveries`` recoveries were made; otherwise it fails, its one line naming
  every node lost so far.

:func:`next_step` is the coordinator's question at a failure's settling: regroup now,
wait until every survivor has stopped its torchrun (its last word), or give the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from higgsfield.contract.failure import Failure
from higgsfield.contract.gang import LastWord
from higgsfield.contract.straggler import Straggler

__all__ = ["WAIT", "Decision", "decide", "losses_line", "next_step", "replacement"]

REGROUP_WAIT_S = 20.0   # how long survivors may take to stop before the run fails instead
WAIT = "wait"


@dataclass(frozen=True)
class Decision:
    survivors: tuple[int, ...]   # member ranks, in node-rank order
    lost: tuple[int, ...]


def decide(active: list[int], lost: set[int], first: Failure, *, min_nodes: int, recoveries: int,
           max_recoveries: int, spares: tuple[int, ...] = ()) -> Decision | None:
    """The run's next node set (member ranks) after ``lost``: the survivors, then as many standing-by
    ``spares`` as the lost nodes (a run without ``min_nodes`` must stay whole); None when it fails instead."""
    if not first.lost or not lost or recoveries >= max_recoveries or (min_nodes <= 0 and not spares):
        return None
    survivors = tuple(r for r in active if r not in lost)
    if not survivors:
        return None
    nodes = survivors + spares[:len(active) - len(survivors)]
    if len(nodes) < (min_nodes if min_nodes > 0 else len(active)):
        return None
    return Decision(survivors=nodes, lost=tuple(r for r in active if r in lost))


def losses_line(lost_before: list[str], failure: Failure) -> Failure:
    """The run's failure, naming the nodes it had lost and recovered from before it (if any)."""
    if not lost_before:
        return failure
    return replace(failure, reason=f"{failure.reason} (after recovering from the loss of {', '.join(lost_before)})")



def next_step(active: list[int], final: dict[int, LastWord], first: Failure, *, waited: float, min_nodes: int,
              recoveries: int, max_recoveries: int, spares: tuple[int, ...] = ()) -> Decision | str | None:
    """At the settling of a failure: a :class:`Decision` (regroup now), :data:`WAIT` (survivors are still
    stopping their torchrun) or None (no recovery: the verdict goes out)."""
    lost = {r for r in active if final.get(r) is LastWord.LOST}
    found = decide(active, lost, first, min_nodes=min_nodes, recoveries=recoveries, max_recoveries=max_recoveries,
                   spares=spares)
    if found is None:
        return None
    if any(r not in final for r in found.survivors if r in active):   # a survivor that does not stop is as good as lost
        return WAIT if waited < REGROUP_WAIT_S else None
    return found


def replacement(stragglers: tuple[Straggler, ...], nodes: list[str], active: list[int], ready: list[int], *,
                recoveries: int, max_recoveries: int) -> tuple[int, Straggler] | str:
    """``on_straggler: replace``: the member rank to put out of the run for a standing-by spare (``ready``: those
    connected), as a lost node is, and the straggler that names it; or why none is (a line for the log)."""
    for s in stragglers:
        rank = nodes.index(s.node) if s.node in nodes else -1
        if rank not in active:
            continue
        if rank == active[0]:
            return f"{s.node} (rank {s.rank}) is a straggler; node 0 hosts the coordinator and is not replaced"
        if not ready:
            return f"{s.node} (rank {s.rank}) is a straggler; no spare stands by to replace it"
        if recoveries >= max_recoveries:
            return f"{s.node} (rank {s.rank}) is a straggler; the run made its {max_recoveries} recoveries"
        return rank, s
    return "no straggler of the run's nodes now"


"""The nodes that active runs lost and went on without, as ``doctor`` shows them, healthy again or not.

A lost node's own record of a run stays as the loss left it (it never learnt it was lost), so
the survivors' records say it: each recovery is an attempt naming the nodes whose loss began it
(:attr:`~higgsfield.contract.runstatus.RunStatus.recoveries`). ``status`` shows such a node as
``lost`` in that run; ``doctor`` lists it under its checks for as long as the run is active, with
whether it is healthy now. A node is lost to that run alone: it never rejoins it, and once its
checks pass again new runs may pick it, which is what the line says.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from higgsfield.contract.runstatus import RunStatus
from higgsfield.contract.states import ACTIVE
from higgsfield.control.doctor.report import DoctorReport

__all__ = ["LostNode", "line", "lost_nodes"]


@dataclass(frozen=True)
class LostNode:
    """A node an active run lost: which run, when (the recovery's start), and whether its checks pass now
    (None: the doctor did not check it)."""

    node: str
    run: str
    at: float
    healthy: bool | None


def lost_nodes(runs: Iterable[RunStatus], report: DoctorReport) -> list[LostNode]:
    """Every node an active run lost, oldest loss first."""
    healthy = {n.node: all(p.ok for p in n.checks.values()) for n in report.nodes}
    found = [LostNode(node, r.run, a.at, healthy.get(node))
             for r in runs if r.state in ACTIVE for a in r.recoveries for node in a.lost]
    return sorted(found, key=lambda x: x.at)


def line(lost: LostNode, when: str) -> str:
    """``hfnode8: lost by run r1 at 14:02 (it goes on without it); healthy now: new runs may use it``."""
    now = {True: "healthy now: new runs may use it", False: "still failing its checks (above)",
           None: "not checked now"}[lost.healthy]
    return f"{lost.node}: lost by run {lost.run} at {when} (it goes on without it); {now}"

"""How a supervisor's part of a run ends (:class:`Outcome`), and its launcher log's lines (:func:`say`).

Shared by :mod:`higgsfield.node.runs.supervisor` and the modules that act for it
(:mod:`higgsfield.node.runs.stall_answer`). ``REGROUP`` is no end: a node was lost and
the run goes on (:mod:`higgsfield.node.runs.regroup`).
"""

from __future__ import annotations

from dataclasses import dataclass

from higgsfield.contract.failure import Failure

__all__ = ["REGROUP", "Outcome", "say"]

REGROUP = "regroup"     # an Outcome's state: no end, the run goes on on other nodes (Member.regroup)


def say(msg: str) -> None:
    """A line in the launcher log (the supervisor's stdout)."""
    print(f"[higgsfield] {msg}", flush=True)


@dataclass
class Outcome:
    state: str
    rc: int | None = None
    failure: Failure | None = None

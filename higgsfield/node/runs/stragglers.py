"""A run's stragglers on this node: the coordinator's finding kept in the record and sent as word.

The coordinator's rule (:mod:`higgsfield.node.gang.stragglers`) names the ranks whose own
work per step stayed well above the run's median and broadcasts them
(:class:`~higgsfield.contract.gang.Straggling`) whenever the set changes. Every node's
supervisor passes its inbox's messages through :func:`noted`, which keeps the set in the
run's record (``stragglers``: what ``status`` and the dashboard show) and, for each rank
named anew, writes a line to the launcher log and sends the ``straggler`` notify event
(node 0 holds the destinations; the others send none). ``on_straggler: warn`` is this and
nothing more: the run goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from higgsfield.contract.gang import Straggling
from higgsfield.node.runs.notify import Note, Notifier
from higgsfield.node.state.records import RunDir

M = TypeVar("M")


def noted(msg: M, rd: RunDir, notifier: Notifier, note: Callable[..., Note],
          say: Callable[[str], None]) -> M | None:
    """``msg`` itself, or None when it was a :class:`Straggling` (kept in the record, named ranks told)."""
    if not isinstance(msg, Straggling):
        return msg
    try:
        record = rd.read()
        before = {s.rank for s in record.stragglers}
        record.stragglers = list(msg.stragglers)
        rd.write(record)
    except (OSError, ValueError) as e:
        say(f"stragglers: the record: {type(e).__name__}: {e}")
        before = set()
    if not msg.stragglers:
        say("stragglers: none now")
    for s in msg.stragglers:
        if s.rank not in before:
            say(f"straggler: {s.summary}")
            notifier.event(note("straggler", node=s.node, rank=s.rank, detail=s.summary))
    return None


__all__: list[Any] = ["noted"]

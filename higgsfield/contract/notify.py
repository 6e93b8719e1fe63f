"""Word sent from the nodes: which events of a run reach the user, and where (``notify:`` of higgsfield.yml).

The destinations are apprise URLs (``slack://``, ``discord://``, ``mailto://``, ``ntfy://``,
``json://`` for any webhook...). Each holds a credential, so each is a *secret*: higgsfield.yml
names it, its value comes from the env file or the CI's secrets like any other, and it travels
only in the start request's stdin to the run's supervisor (:class:`Notify` in the
:class:`~higgsfield.contract.runspec.Handoff`), never in the training's environment, a file, a
log or an argv. Node 0's supervisor sends (:mod:`higgsfield.node.runs.notify`), so word goes
out with the laptop closed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

Event = Literal["started", "succeeded", "failed", "stalled", "recovered", "lost", "straggler"]
EVENTS: tuple[Event, ...] = ("started", "succeeded", "failed", "stalled", "recovered", "lost", "straggler")
"""``started``: torchrun runs on node 0; ``succeeded`` / ``failed``: the run's end (a kill by a user is
not news to them); ``stalled``: the watchdog's diagnosis; ``lost``: a node lost (told at the regroup by
node 0 of the next attempt, or with the run's failure when it does not go on); ``recovered``: the next
attempt's torchrun started on the new node set (instead of a second ``started``); ``straggler``: a rank named slow by its own work per step (``on_straggler: warn``)."""
DEFAULT_EVENTS: tuple[Event, ...] = ("succeeded", "failed", "stalled", "recovered", "lost", "straggler")
"""Everything but ``started``: what a user away from the screen wants to hear of."""


@dataclass(frozen=True)
class Notify:
    """Where node 0 sends a run's events (the URLs: secret values) and which events."""

    WHAT: ClassVar[str] = "notify settings"

    urls: tuple[str, ...] = field(default=(), repr=False)
    events: tuple[Event, ...] = DEFAULT_EVENTS

    def wants(self, event: Event) -> bool:
        return bool(self.urls) and event in self.events

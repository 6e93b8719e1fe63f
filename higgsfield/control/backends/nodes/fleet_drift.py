"""The dashboard's drift marks: the fleet's nodes compared now and then (``invoker facts`` on the connections
it holds), so the Nodes view can mark a node that differs from the others.

Asked when the dashboard starts and every ``DRIFT_EVERY_S`` after (a deploy or a ``pip install``
by hand shows within that), over the nodes that are up; one short session per node each
time, never per page refresh. A node that is down is marked by its feed already.
"""

from __future__ import annotations

from collections.abc import Callable

from higgsfield.contract.drift import DriftReport
from higgsfield.control.backends.nodes.drift import drift_report
from higgsfield.control.backends.nodes.periodic import Periodic
from higgsfield.control.config import Config
from higgsfield.control.remote import Group, Member

DRIFT_EVERY_S = 60.0


class DriftWatch(Periodic):
    """The last :class:`DriftReport` of the up nodes, asked every ``every`` seconds; ``changed()`` after each."""

    def __init__(self, cfg: Config, members: Callable[[], list[Member]], changed: Callable[[], None], *,
                 every: float = DRIFT_EVERY_S) -> None:
        super().__init__(every)
        self.cfg, self.members, self.changed = cfg, members, changed
        self.report: DriftReport | None = None

    async def check(self) -> None:
        up = self.members()
        if len(up) >= 2:
            self.report = await drift_report(Group(up), self.cfg)
            self.changed()

    def marks(self, node: str) -> list[str]:
        """The node's differences, one line each (``numpy 1.26.4 (the other 2 nodes: 2.1.0)``)."""
        if self.report is None:
            return []
        return [f"{d.label} {d.against()}" for d in self.report.differences if d.node == node]

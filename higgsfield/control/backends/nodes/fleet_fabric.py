"""The dashboard's fabric marks: each node's figures from the last fabric test, and the slow node marked.

The result lives on the nodes (node 0 of each test keeps its result line in the run's log,
:mod:`higgsfield.node.observe.fabric_last`), so a laptop that ran ``doctor --fabric`` yesterday,
or another laptop, shows the same. Asked of every up node (``invoker fabric-last``) when the
dashboard starts, every ``FABRIC_EVERY_S`` after, and at once when the feeds report a fabric test
ended that was not seen before (:meth:`FabricWatch.seen`: a test just finished, or a node's first
report once its feed is up); the newest answer wins. A node whose invoker is older
(no such verb) or whose answer does not decode simply has nothing to add.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from higgsfield.contract.codec import decode
from higgsfield.contract.fabric_last import PREFIX, LastFabric, newest, node_marks
from higgsfield.control.backends.nodes.output import invoke
from higgsfield.control.backends.nodes.periodic import Periodic
from higgsfield.control.config import Config
from higgsfield.control.remote import Group, Member

FABRIC_EVERY_S = 120.0


class FabricWatch(Periodic):
    """The newest :class:`LastFabric` among the up nodes; ``changed()`` when it changes."""

    def __init__(self, cfg: Config, members: Callable[[], list[Member]], changed: Callable[[], None], *,
                 every: float = FABRIC_EVERY_S) -> None:
        super().__init__(every)
        self.cfg, self.members, self.changed = cfg, members, changed
        self.last: LastFabric | None = None
        self._marks: dict[str, dict[str, Any]] = {}
        self._ended: set[str] = set()

    def seen(self, ended: Iterable[str]) -> None:
        """The runs the feeds report ended: a fabric test not seen ended before is asked for at once."""
        new = {r for r in ended if r.startswith(PREFIX)} - self._ended
        if new:   # also a node's first report: its feed is up now, so it can be asked (the first round may not)
            self._ended |= new
            self.wake()

    def take(self, lasts: Iterable[LastFabric | None]) -> None:
        """Keep the newest result (an older or equal one changes nothing)."""
        best = newest([self.last, *lasts])
        if best is not None and best != self.last:
            self.last, self._marks = best, node_marks(best)
            self.changed()

    def marks(self, node: str) -> dict[str, Any] | None:
        """The node's figures from the last test and ``slow`` (None: not in the last test, or none run)."""
        return self._marks.get(node)

    async def check(self) -> None:
        async def one(m: Member) -> LastFabric:
            return decode(LastFabric, await invoke(m.transport, self.cfg, ["fabric-last", "--project",
                                                                              self.cfg.name]))
        up = self.members()
        if up:
            results = await Group(up).run(one, timeout=self.cfg.ssh.command_timeout)
            self.take(r.value for r in results if r.ok)

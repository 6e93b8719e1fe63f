"""Where the dashboard's live state comes from: the project's backend, seen for as long as the page is open.

The :class:`~higgsfield.control.ui.hub.Hub` shows runs and machines and acts on them; a
:class:`Fleet` is how it sees and reaches them, one per backend:

- :class:`~higgsfield.control.ui.nodes.NodesFleet`: SSH nodes. Each node pushes its run records,
  queue and machine samples over the one connection the dashboard holds to it
  (``invoker stats --follow``); nothing is polled.
- :class:`~higgsfield.control.ui.cluster.ClusterFleet`: a Slurm cluster. Only Slurm knows its
  queue and nodes, so the login node is asked (squeue/sacct, sinfo) every few seconds
  over one held connection, and right after the page kills or starts a run.

Whatever the fleet, a run is the backend's :class:`~higgsfield.contract.runspec.RunStatus`, and
every action and every run page (logs, metrics, kill, start) goes through the backend's
own :class:`~higgsfield.control.backends.nodes.Session` (:meth:`Fleet.session`), the very calls
behind ``higgsfield logs``, ``metrics`` and ``kill``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from higgsfield.contract.runspec import RunStatus
from higgsfield.control.backends import Session
from higgsfield.control.backends.backend import Plan
from higgsfield.control.backends.nodes import RunHandle

#: How a fleet tells the hub what changed: ``"runs"`` (records, queue) or ``"node"`` (a machine).
Changed = Callable[[str], None]


class Fleet(Protocol):
    """The runs and machines of one backend, kept up to date while the dashboard runs."""

    label: str
    """What the dashboard runs against, in words (``3 node(s)``, ``Slurm partition gpu through login``)."""

    async def start(self) -> None:
        """Connect (a host key that is not the pinned one refuses the dashboard) and start watching."""

    async def close(self) -> None: ...

    def runs(self) -> list[RunStatus]:
        """Every run of the project, oldest first (a part that stopped answering: its last known runs)."""

    def nodes(self) -> list[dict[str, Any]]:
        """The node view's cards: name, host, state (up/down), reason, sample, history, queue."""

    def places(self, status: RunStatus) -> dict[str, Any]:
        """What the runs table adds to ``status``: ``stale_nodes``, per-node ``queue`` places, ``queue_position``."""

    def session(self, nodes: Sequence[str] | None = None) -> Session:
        """The backend's Session over the fleet's open connections (``nodes``: only those SSH nodes)."""

    def where(self, plan: Plan) -> str:
        """Where ``plan`` would run, in words (``on a, b`` / ``as a Slurm job of 2 node(s) on partition gpu``)."""

    def learn(self, handle: RunHandle) -> None:
        """A run the page just started: shown at once, before the next news from the backend."""

    def poke(self) -> None:
        """Something changed from here (a kill): look again now rather than at the next tick."""

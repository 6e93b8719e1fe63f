"""What every backend's dashboard fleet shares: the words of the node view and how an error reads there.

A :class:`~higgsfield.control.backends.backend.Fleet` (made by
:meth:`~higgsfield.control.backends.backend.Backend.fleet`) is how the dashboard sees and
reaches one backend's runs and machines, one per backend and inside its package:

- :class:`~higgsfield.control.backends.nodes.fleet.NodesFleet`: SSH nodes. Each node pushes its
  run records, queue and machine samples over the one connection the dashboard holds to it
  (``invoker stats --follow``); nothing is polled.
- :class:`~higgsfield.control.backends.slurm.fleet.ClusterFleet`: a Slurm cluster. Only Slurm knows
  its queue and nodes, so the login node is asked (squeue/sacct, sinfo) every few seconds
  over one held connection, and right after the page kills or starts a run.

Whatever the fleet, a run is the backend's :class:`~higgsfield.contract.runstatus.RunStatus`, and
every action and every run page (logs, metrics, kill, start) goes through the backend's
own :class:`~higgsfield.control.backends.backend.Session` (``Fleet.session``), the very calls
behind ``higgsfield logs``, ``metrics`` and ``kill``.
"""

from __future__ import annotations

UP, DOWN, CONNECTING = "up", "down", "connecting"
"""A node card's state (a machine, or a Slurm cluster's login node)."""

HISTORY = 90            # samples kept for a node card's sparklines (3 minutes at 2 s)


def why(e: BaseException) -> str:
    """An error as one reason for the page (a remote error's own reason, else its text, else its type)."""
    reason = getattr(e, "reason", None)
    return str(reason or e) or type(e).__name__

"""How long the control side gives a node, by phase: named once, not spelled as arithmetic at each call.

A step on one node is its connection, then its command. The connect phase is
``ssh.connect_timeout`` (the group opens every connection before the first step, so
a step rarely spends it); the command phases below are what the node's invoker
needs for each verb. :func:`step_timeout` is a whole step's bound, for
:meth:`~higgsfield.control.remote.fanout.Group.run`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from higgsfield.control.remote.base import Timeouts

if TYPE_CHECKING:
    from higgsfield.control.config import Config

START_S = 120.0
"""``invoker start``: the node records the run, spawns its supervisor, and (node 0) binds the coordinator.
The command itself is bounded by ``ssh.command_timeout``; this bounds the step."""

QUERY_S = 60.0
"""``invoker status`` and ``invoker kill``: read the run records, signal a run's processes."""

FINAL_WAIT_S = 30.0
"""How long ``run`` waits, once its logs ended, for the run's records to say it ended."""

FINAL_POLL_S = 1.0
"""How often ``run`` asks again meanwhile (over the connections it holds: no new login)."""


def phases(cfg: Config, command_s: float) -> Timeouts:
    """The phases of a step whose command may take ``command_s``, with this project's connect timeout."""
    return Timeouts(connect=cfg.ssh.connect_timeout, command=command_s, retries=cfg.ssh.retries)


def step_timeout(cfg: Config, command_s: float) -> float:
    """A whole step on one node: its connect phase, then a command of at most ``command_s``."""
    t = phases(cfg, command_s)
    return t.connect + (t.command or 0.0)

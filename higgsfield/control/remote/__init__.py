"""Reaching nodes: one Transport per node, and a fan-out over all of them.

Use::

    async with open_group(cfg) as group:
        results = await group.run(lambda m: m.transport.run(["uname", "-a"]))
        for r in results: print(r.node, r.ok, r.value or r.error)
"""

from __future__ import annotations

from higgsfield.control.remote.base import CommandResult, Transport
from higgsfield.control.remote.fanout import (
    Group,
    Member,
    NodeResult,
    open_group,
    select_nodes,
    transport_for,
)

__all__ = ["CommandResult", "Group", "Member", "NodeResult", "Transport", "open_group", "select_nodes", "transport_for"]

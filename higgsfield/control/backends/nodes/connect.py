"""The nodes of one command, connected once and kept for every step of it.

A command opens its group here and hands it to every call it makes: ``higgsfield
run`` starts the run, follows its logs and asks its final status over the same SSH
connections, with no new login per step or per poll.

Use::

    async with connect(cfg, plan.nodes) as group:
        handle = await launch(group, cfg, plan)
        status = await final_status(group, cfg, handle.run)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from higgsfield.control.config import Config, NodeConfig
from higgsfield.control.remote import Group, open_group


@asynccontextmanager
async def connect(cfg: Config, nodes: Sequence[NodeConfig] | None = None) -> AsyncIterator[Group]:
    """``nodes`` (default: every node of higgsfield.yml), connected and their host keys verified; closed after."""
    async with open_group(cfg, nodes) as group:
        yield group

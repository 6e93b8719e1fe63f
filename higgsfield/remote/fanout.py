"""Run one step on every node truly concurrently and get a result per node.

A step is an ``async`` callable taking the node's :class:`Transport`. Each node's
step runs as its own task; one node failing or hanging never stops the others
(a per-step timeout bounds it). Results come back in node order: ``ok`` with the
step's ``value``, or failed with the ``error`` and a one-line ``reason``.
:meth:`Group.check` turns failures into one :class:`~higgsfield.errors.GroupError`
that holds every result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from higgsfield.errors import GroupError, HiggsfieldError
from higgsfield.remote.base import Transport

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from higgsfield.config import Config, NodeConfig

T = TypeVar("T")


@dataclass
class NodeResult(Generic[T]):
    """The outcome of one step on one node."""

    node: str
    rank: int
    value: T | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def reason(self) -> str:
        if self.error is None:
            return ""
        if isinstance(self.error, HiggsfieldError):
            reason = getattr(self.error, "reason", None)
            return str(reason or self.error)
        if isinstance(self.error, asyncio.TimeoutError):
            return "timed out"
        return f"{type(self.error).__name__}: {self.error}"


def transport_for(cfg: Config, node: NodeConfig, *, pin: bool = True) -> Transport:
    """LocalTransport for ``localhost``, SSHTransport otherwise, with ``ssh.command_timeout``.

    ``pin=False`` writes no new host-key pins; whether an unpinned node is trusted at
    all is ``cfg.trust_new_hosts`` (False in CI).
    """
    if node.is_local:
        from higgsfield.remote.local import LocalTransport

        return LocalTransport(str(node.name), command_timeout=cfg.ssh.command_timeout)
    from higgsfield.remote.ssh import SSHTransport

    return SSHTransport.from_config(cfg, node, pin=pin)


class Group:
    """The transports of several nodes, in node-rank order."""

    def __init__(self, transports: Sequence[Transport]) -> None:
        self.transports = list(transports)

    async def run(self, step: Callable[[Transport], Awaitable[T]],
                  timeout: float | None = None) -> list[NodeResult[T]]:
        async def one(rank: int, t: Transport) -> NodeResult[T]:
            try:
                value = await asyncio.wait_for(step(t), timeout) if timeout else await step(t)
                return NodeResult(t.node, rank, value=value)
            except Exception as e:  # noqa: BLE001 - every failure becomes that node's result
                # (KeyboardInterrupt, SystemExit and cancellation are not a node's failure: they propagate)
                return NodeResult(t.node, rank, error=e)

        return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(self.transports))))

    @staticmethod
    def check(results: list[NodeResult[Any]], what: str) -> list[NodeResult[Any]]:
        failed = [r for r in results if not r.ok]
        if failed:
            detail = "; ".join(f"{r.node}: {r.reason}" for r in failed)
            raise GroupError(f"{what} failed on {len(failed)} of {len(results)} node(s): {detail}", results)
        return results

    async def close(self) -> None:
        await asyncio.gather(*(t.close() for t in self.transports), return_exceptions=True)


@asynccontextmanager
async def open_group(cfg: Config, nodes: Sequence[NodeConfig] | None = None) -> AsyncIterator[Group]:
    group = Group([transport_for(cfg, n) for n in (nodes if nodes is not None else cfg.nodes)])
    try:
        yield group
    finally:
        await group.close()

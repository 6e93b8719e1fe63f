"""Run one step on every node truly concurrently and get a result per node.

This is the one way the control side does something on several nodes (setup,
doctor, deploy and runs all use it). A step is an ``async`` callable taking a
:class:`Member`: the node's configuration, its :class:`Transport` and its rank, so
no step looks its node up again. Each node's step runs as its own task; one node failing or hanging never stops the others
(a per-step timeout bounds it). Results come back in node order: ``ok`` with the
step's ``value``, or failed with the ``error`` and a one-line ``reason``.
:meth:`Group.check` turns failures into one :class:`~higgsfield.contract.errors.GroupError`
that holds every result.

:func:`open_group` connects every node first and refuses the whole operation when
any node's host key is not the pinned one (:meth:`Group.connect`): no step runs
anywhere on a cluster with an unverified member, and the error is that node's one line.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from higgsfield.contract.errors import GroupError, HiggsfieldError, HostKeyError, RunError
from higgsfield.control.remote.base import Transport

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import asyncssh

    from higgsfield.control.config import Config, NodeConfig

T = TypeVar("T")


@dataclass(frozen=True)
class Member:
    """One node of a group: its configuration, its transport and its rank (its place in the group)."""

    node: NodeConfig
    transport: Transport
    rank: int

    @property
    def name(self) -> str:
        return self.transport.node


def select_nodes(cfg: Config, count: int | None = None, names: Sequence[str] = ()) -> list[NodeConfig]:
    """The nodes an operation runs on, in node-rank order: the first ``count``, or those ``names``, or all.

    An unknown name raises the config's one-line error; a count out of range names the file.
    """
    if names:
        wanted = {id(cfg.node(n)) for n in names}  # raises ConfigError for an unknown name
        return [n for n in cfg.nodes if id(n) in wanted]
    if count is None:
        return list(cfg.nodes)
    if not 1 <= count <= len(cfg.nodes):
        raise RunError(f"--nodes {count}: the project has {len(cfg.nodes)} node(s) in {cfg.path}")
    return list(cfg.nodes[:count])


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


def transport_for(cfg: Config, node: NodeConfig, *, trusted: Sequence[asyncssh.SSHKey] = ()) -> Transport:
    """LocalTransport for ``localhost``, SSHTransport otherwise, with ``ssh.command_timeout``.

    An SSH transport trusts only the keys pinned in ``ssh.known_hosts`` (see
    :mod:`higgsfield.control.remote.hostkeys`), and the ``trusted`` ones for itself alone (the
    keys a user accepted for a ``setup --dry-run``, which pins nothing); it never pins one.
    """
    if node.is_local:
        from higgsfield.control.remote.local import LocalTransport

        return LocalTransport(str(node.name), command_timeout=cfg.ssh.command_timeout)
    from higgsfield.control.remote.ssh import SSHTransport

    return SSHTransport.from_config(cfg, node, trusted=trusted)


class Group:
    """The members of several nodes, in rank order."""

    def __init__(self, members: Sequence[Member]) -> None:
        self.members = list(members)

    @classmethod
    def of(cls, cfg: Config, nodes: Sequence[NodeConfig], *,
           trusted: Mapping[str, Sequence[asyncssh.SSHKey]] | None = None) -> Group:
        """A group of ``nodes`` (not connected yet), ranked in the given order.

        ``trusted``: node name -> host keys its transport trusts besides the pinned ones
        (see :func:`transport_for`); only ``setup --dry-run`` passes any.
        """
        keys = trusted or {}
        return cls([Member(n, transport_for(cfg, n, trusted=keys.get(str(n.name), ())), i)
                    for i, n in enumerate(nodes)])

    @property
    def transports(self) -> list[Transport]:
        return [m.transport for m in self.members]

    def __getitem__(self, index: slice) -> Group:
        """The members in ``index`` (a slice), keeping their ranks: node 0 first, then the rest."""
        return Group(self.members[index])

    async def run(self, step: Callable[[Member], Awaitable[T]],
                  timeout: float | None = None) -> list[NodeResult[T]]:
        async def one(m: Member) -> NodeResult[T]:
            try:
                value = await asyncio.wait_for(step(m), timeout) if timeout else await step(m)
                return NodeResult(m.name, m.rank, value=value)
            except Exception as e:  # noqa: BLE001 - every failure becomes that node's result
                # (KeyboardInterrupt, SystemExit and cancellation are not a node's failure: they propagate)
                return NodeResult(m.name, m.rank, error=e)

        return list(await asyncio.gather(*(one(m) for m in self.members)))

    @staticmethod
    def check(results: list[NodeResult[Any]], what: str) -> list[NodeResult[Any]]:
        failed = [r for r in results if not r.ok]
        if failed:
            detail = "; ".join(f"{r.node}: {r.reason}" for r in failed)
            raise GroupError(f"{what} failed on {len(failed)} of {len(results)} node(s): {detail}", results)
        return results

    async def connect(self) -> None:
        """Open every node's connection at once, and refuse the whole group if any host key is not verified.

        A node that is not pinned, or whose key changed, raises its
        :class:`~higgsfield.contract.errors.HostKeyError` here, naming the other refused nodes
        too, before any command runs on any node: an operation across nodes (a run
        that sends secrets, a kill, a deploy) never starts half-way on an unverified
        cluster. Any other connection failure stays with its transport and becomes
        that node's result when a step uses it (the transport remembers it, so the
        timeout is not paid twice).
        """
        results = await asyncio.gather(*(t.connect() for t in self.transports), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, Exception):
                raise r  # cancellation, KeyboardInterrupt
        refused = [(t, r) for t, r in zip(self.transports, results, strict=True) if isinstance(r, HostKeyError)]
        if refused:
            first = refused[0][1]
            assert isinstance(first, HostKeyError)
            if len(refused) == 1:
                raise first
            others = ", ".join(t.node for t, _ in refused[1:])
            raise type(first)(first.node, f"{first.reason} (refused too: {others})")

    async def close(self) -> None:
        await asyncio.gather(*(t.close() for t in self.transports), return_exceptions=True)


@asynccontextmanager
async def open_group(cfg: Config, nodes: Sequence[NodeConfig] | None = None) -> AsyncIterator[Group]:
    """The group of ``nodes`` (default: all), connected, host keys verified (see :meth:`Group.connect`)."""
    group = Group.of(cfg, nodes if nodes is not None else cfg.nodes)
    try:
        await group.connect()
        yield group
    finally:
        await group.close()

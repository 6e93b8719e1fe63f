"""The nodes copy a push's objects among themselves: rounds in which every node holding them serves one that lacks them.

Node 0 holds everything once the laptop has sent it. In each round every holder is paired with
a node still lacking objects, and the pairs copy at once: 1 -> 2 -> 4 -> 8 holders, so 64 nodes
take 6 rounds, and no node's link serves more than one copy at a time (a star from node 0 would
divide its link by N; a chain would take N-1 rounds). A copy is ``invoker data serve`` on the
holder (it prints the port it listens on) and ``invoker data fetch`` on the other, the same fresh
token given to both on SSH stdin; the nodes authenticate each other with the gang wire's
handshake (:mod:`higgsfield.node.data.peer`), and no node ever opens a shell on another.

A node that fails its copy fails the push (one line naming it, through the group's result); the
objects it stored stay, so the next push copies only the rest.
"""

from __future__ import annotations

import asyncio
import json
import secrets as _random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from higgsfield.contract.codec import encode
from higgsfield.contract.data import (
    CommitRequest,
    DataError,
    FetchRequest,
    PutReply,
    ServeReady,
    ServeRequest,
)
from higgsfield.contract.errors import RemoteError
from higgsfield.control.backends.nodes.output import decode_reply
from higgsfield.control.config import Config
from higgsfield.control.remote import Group, Member
from higgsfield.control.remote.invoker import invoker_argv

COPY_TIMEOUT_S = 6 * 3600.0


@dataclass
class NodeProgress:
    """One node's part of a push, as the live view and ``--json`` show it."""

    node: str
    state: str = "checking"
    total: int = 0          # bytes this node lacked
    done: int = 0           # bytes it received so far
    via: str = ""           # "laptop", or the node it copied from
    started: float | None = None
    ended: float | None = None

    @property
    def rate(self) -> float:
        """Bytes per second since its transfer began."""
        if self.started is None:
            return 0.0
        spent = (self.ended or time.monotonic()) - self.started
        return self.done / spent if spent > 0 else 0.0

    @property
    def eta(self) -> float | None:
        r = self.rate
        return (self.total - self.done) / r if r > 0 and self.done < self.total else None


async def copy(cfg: Config, src: Member, dst: Member, shas: list[str], p: NodeProgress,
               tick: Callable[[], None], commits: list[CommitRequest]) -> None:
    """``dst`` takes ``shas`` from ``src`` (module doc)."""
    token = _random.token_hex(32)
    serve = src.transport.stream([*invoker_argv(cfg, src.node), "data", "serve", "--project", cfg.name],
                                 input=json.dumps(encode(ServeRequest(token=token))))
    try:
        first = await asyncio.wait_for(serve.__anext__(), cfg.ssh.command_timeout)
        ready = decode_reply(src.name, first, ServeReady)
        p.state, p.via, p.started = f"copying from {src.name}", src.name, time.monotonic()
        tick()
        req = FetchRequest(host=src.node.host, port=ready.port, token=token, shas=shas, commits=commits)
        argv = [*invoker_argv(cfg, dst.node), "data", "fetch", "--project", cfg.name]

        async def fetch() -> None:
            async for line in dst.transport.stream(argv, input=json.dumps(encode(req))):
                got = decode_reply(dst.name, line, PutReply)
                p.done = got.bytes
                tick()

        await asyncio.wait_for(fetch(), COPY_TIMEOUT_S)
        async for _ in serve:   # the server's last line, and its exit status
            pass
    except StopAsyncIteration:
        raise DataError(f"{src.name}: the data server ended before it listened") from None
    finally:
        await serve.aclose()  # type: ignore[attr-defined]
    p.done, p.ended = p.total, time.monotonic()
    p.state = "done"
    tick()


async def copy_rounds(cfg: Config, group: Group, missing: dict[str, list[str]], prog: dict[str, NodeProgress],
                      tick: Callable[[], None], *, commit: Callable[[Member], Awaitable[None]],
                      commits: Callable[[Member], list[CommitRequest]]) -> None:
    """Every node but node 0 gets its ``missing`` objects from a holder, in doubling rounds, and makes the
    new versions current (``commits``, in the same command); a node that lacks nothing only ``commit``s."""
    first, rest = group.members[0], group.members[1:]
    holders = [first] + [m for m in rest if not missing[m.name]]
    pending = [m for m in rest if missing[m.name]]
    done_now = [m for m in rest if not missing[m.name]]
    results = await Group(done_now).run(commit)
    Group.check(results, "data commit")
    while pending:
        pairs = list(zip(holders, pending, strict=False))
        pending = pending[len(pairs):]

        async def one(pair: tuple[Member, Member]) -> Member:
            src, dst = pair
            await copy(cfg, src, dst, missing[dst.name], prog[dst.name], tick, commits(dst))
            return dst

        got = await asyncio.gather(*(one(pr) for pr in pairs), return_exceptions=True)
        failed = [(pr[1].name, g) for pr, g in zip(pairs, got, strict=True) if isinstance(g, BaseException)]
        if failed:
            for name, _ in failed:
                prog[name].state = "failed"
            tick()
            name, err = failed[0]
            raise RemoteError(name, f"copying the data from another node failed: {err}")
        holders += [g for g in got if isinstance(g, Member)]

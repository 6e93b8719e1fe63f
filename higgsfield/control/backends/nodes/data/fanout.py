"""The nodes copy a push's objects among themselves, in a chain that follows the upload object by object.

Node 0 gets the objects from the laptop; node 1 fetches them from node 0, node 2 from node 1, and
so on, all at once from the start of the push: each node's server (``invoker data serve``, waiting
mode) sends an object the moment it is stored there, and waits for the next one while it is still
on its way (from the laptop, or from the node before). So every hop follows the upload a few
objects behind, each node's link carries each byte once in and once out, and the push ends about
one object per hop after the laptop's last byte: one serve and one fetch per node for the whole
push. (The first chain polled instead: the laptop asked each node what the one before it held, then
started a serve and a fetch for that much, again and again; each round was three SSH execs and
invoker start-ups, seconds on a loaded 2-core machine, and 500 MB to 4 nodes took 63 s against
rsync's 162 s. Doubling rounds, 1 -> 2 -> 4 holders, measured the same: each round waited for the
one before it. docs/benchmarks.md has the figures.) A server's stdin stays open for the push: when
the laptop goes (killed, cut), its channel closes and the waiting server ends, and its fetcher with it.

The serve and the fetch get the same fresh token on SSH stdin; the nodes authenticate each other
with the gang wire's handshake (:mod:`higgsfield.node.data.peer`), and no node ever opens a shell on
another. An object is sent whole once stored (verified) on the sending node: a file larger than a
batch crosses each hop after the one before it has all of it, not cut through.

A node that fails its copy fails the push (one line naming it); the objects it stored stay, so
the next push copies only the rest.
"""

from __future__ import annotations

import asyncio
import json
import secrets as _random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

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
               tick: Callable[[], None], commits: list[CommitRequest]) -> int:
    """``dst`` takes ``shas`` from ``src``, waiting there for those still on their way (module doc); the
    bytes it took. ``commits``: the versions ``dst`` makes current once it holds them all."""
    token = _random.token_hex(32)
    argv = [*invoker_argv(cfg, src.node), "data", "serve", "--project", cfg.name]
    async with src.transport.session(argv) as serve:
        await serve.send(json.dumps(encode(ServeRequest(token=token, wait=True))) + "\n")
        first = await asyncio.wait_for(serve.receive(), cfg.ssh.command_timeout)
        if first is None:
            done = await serve.finish()
            raise DataError(f"{src.name}: the data server ended before it listened: "
                            f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
        ready = decode_reply(src.name, first, ServeReady)
        p.state, p.via = f"copying from {src.name}", src.name
        tick()
        took = 0
        req = FetchRequest(host=src.node.host, port=ready.port, token=token, shas=shas, commits=commits)
        fetch_argv = [*invoker_argv(cfg, dst.node), "data", "fetch", "--project", cfg.name]

        async def fetch() -> None:
            nonlocal took
            async for line in dst.transport.stream(fetch_argv, input=json.dumps(encode(req))):
                took = decode_reply(dst.name, line, PutReply).bytes
                if took and p.started is None:
                    p.started = time.monotonic()
                p.done = took
                tick()

        await asyncio.wait_for(fetch(), COPY_TIMEOUT_S)
        done = await serve.finish()   # its last line (what it sent) and its exit status
        if not done.ok:
            raise DataError(f"{src.name}: the data server failed: "
                            f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    p.done, p.ended, p.state = p.total, time.monotonic(), "done"
    tick()
    return took


async def follow_chain(cfg: Config, group: Group, missing: dict[str, list[str]], prog: dict[str, NodeProgress],
                       tick: Callable[[], None], *,
                       commit: Callable[[Member], Awaitable[None]],
                       commits: Callable[[Member], list[CommitRequest]]) -> None:
    """Every node that lacks objects fetches them from the one before it in the chain, all hops at once
    from the start of the push (module doc); a node that lacks none only commits."""
    rest = group.members[1:]
    chain = [group.members[0]] + [m for m in rest if missing[m.name]]
    await _check(Group([m for m in rest if not missing[m.name]]).run(commit), "data commit")
    tasks = [asyncio.ensure_future(copy(cfg, a, b, list(missing[b.name]), prog[b.name], tick, commits(b)))
             for a, b in zip(chain, chain[1:], strict=False)]
    try:
        for t in asyncio.as_completed(tasks):
            await t
    except BaseException as e:
        for t in tasks:
            t.cancel()
        failed = next((m for m, t in zip(chain[1:], tasks, strict=True) if t.done() and not t.cancelled()
                       and t.exception() is not None), chain[-1])
        prog[failed.name].state = "failed"
        tick()
        if isinstance(e, Exception):
            raise RemoteError(failed.name, f"copying the data from another node failed: {e}") from None
        raise


async def _check(results: Awaitable[list[Any]], what: str) -> None:
    Group.check(await results, what)

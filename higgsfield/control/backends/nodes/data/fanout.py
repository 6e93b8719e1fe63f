"""The nodes copy a push's objects among themselves, in a chain that follows the upload.

Node 0 gets the objects from the laptop; node 1 takes from node 0 whatever node 0 holds already,
again and again until it holds all; node 2 does the same from node 1, and so on. So the copies
overlap the upload, every node's link carries each byte once in and once out, and the push ends
about one copy per hop after the laptop's last byte. (Doubling rounds, 1 -> 2 -> 4 holders, were
the first design: fewer hops at 64 nodes, but each round waited for the one before it, and the
first for the whole upload. On 4 nodes at 100 Mbit/s both measured the same here, 64.0 s and 63.1 s
for 500 MB against rsync's 162 s: every hop pays an SSH exec and an invoker start-up, which a
loaded 2-core machine makes seconds; the chain is kept because its copies need not wait for the
upload, which matters once those start-ups are small against the data.) A copy is ``invoker data serve`` on
the holder (it prints the port it listens on) and ``invoker data fetch`` on the other, the same
fresh token given to both on SSH stdin; the nodes authenticate each other with the gang wire's
handshake (:mod:`higgsfield.node.data.peer`), and no node ever opens a shell on another.

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
               tick: Callable[[], None], commits: list[CommitRequest], *, base: int = 0, final: bool = True) -> int:
    """``dst`` takes ``shas`` from ``src`` (module doc); the bytes it took. ``base``: the bytes ``dst`` took
    before in this push (its progress adds up); ``final``: this copy ends its part."""
    token = _random.token_hex(32)
    serve = src.transport.stream([*invoker_argv(cfg, src.node), "data", "serve", "--project", cfg.name],
                                 input=json.dumps(encode(ServeRequest(token=token))))
    try:
        first = await asyncio.wait_for(serve.__anext__(), cfg.ssh.command_timeout)
        ready = decode_reply(src.name, first, ServeReady)
        p.state, p.via = f"copying from {src.name}", src.name
        p.started = p.started or time.monotonic()
        tick()
        took = 0
        req = FetchRequest(host=src.node.host, port=ready.port, token=token, shas=shas, commits=commits)
        argv = [*invoker_argv(cfg, dst.node), "data", "fetch", "--project", cfg.name]

        async def fetch() -> None:
            nonlocal took
            async for line in dst.transport.stream(argv, input=json.dumps(encode(req))):
                took = decode_reply(dst.name, line, PutReply).bytes
                p.done = base + took
                tick()

        await asyncio.wait_for(fetch(), COPY_TIMEOUT_S)
        async for _ in serve:   # the server's last line, and its exit status
            pass
    except StopAsyncIteration:
        raise DataError(f"{src.name}: the data server ended before it listened") from None
    finally:
        await serve.aclose()  # type: ignore[attr-defined]
    if final:
        p.done, p.ended, p.state = p.total, time.monotonic(), "done"
    tick()
    return took


async def follow_chain(cfg: Config, group: Group, missing: dict[str, list[str]], prog: dict[str, NodeProgress],
                       tick: Callable[[], None], node0_done: asyncio.Event, *,
                       commit: Callable[[Member], Awaitable[None]],
                       commits: Callable[[Member], list[CommitRequest]]) -> None:
    """The nodes copy while the laptop still sends: each node in a chain takes from the one before it
    whatever that one holds already, again and again, until it holds all; so the copies overlap the
    upload and the push ends about one copy after the laptop's last byte, not one round per doubling."""
    rest = group.members[1:]
    chain = [group.members[0]] + [m for m in rest if missing[m.name]]
    await _check(Group([m for m in rest if not missing[m.name]]).run(commit), "data commit")
    done = {m.name: asyncio.Event() for m in chain}
    done[chain[0].name] = node0_done

    async def follower(src: Member, dst: Member) -> None:
        from higgsfield.contract.data import MissingReply, MissingRequest
        from higgsfield.control.backends.nodes.output import invoke_reply

        need, base = list(missing[dst.name]), 0
        while need:
            src_whole = done[src.name].is_set()   # read before asking: whole then means whole at the answer
            lack = await invoke_reply(src.transport, cfg, ["data", "missing", "--project", cfg.name], MissingReply,
                                      input=json.dumps(encode(MissingRequest(shas=need))))
            gone = set(lack.missing)
            have = [s for s in need if s not in gone]
            if have:
                last = len(have) == len(need)
                base += await copy(cfg, src, dst, have, prog[dst.name], tick, commits(dst) if last else [],
                                   base=base, final=last)
                need = [s for s in need if s in gone]
            elif src_whole:
                raise DataError(f"{src.name} finished without {len(need)} object(s) {dst.name} needs")
            else:
                await asyncio.sleep(0.5)
        done[dst.name].set()

    tasks = [asyncio.ensure_future(follower(a, b)) for a, b in zip(chain, chain[1:], strict=False)]
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

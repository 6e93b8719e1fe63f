"""A run's logs from every node, merged as they arrive; following re-attaches a stream that breaks.

Whether a run goes on is decided by its nodes, never here (a laptop cannot tell a
node that died from its own network dropping): the nodes' supervisors and the run's
coordinator on node 0 fail it everywhere within seconds when any node's part fails
or a node is lost (:mod:`higgsfield.node.gang.coordinator`), with or without a control
side. A follower watches every node's stream (the node's invoker sends a heartbeat
line every ``HEARTBEAT_S``): a stream that breaks or goes silent for ``LOST_AFTER_S``
is re-attached over the same transport, skipping the lines already given, so nothing
is lost or shown twice; a node whose stream cannot be re-attached once the others
have ended is reported (:class:`~higgsfield.contract.errors.NodeLost`), and the run's status
says the rest.

Use::

    async with connect(cfg, plan.nodes) as group:
        async for line in follow(group, cfg, status):   # until the run ends on every node
            print(line.node, line.rank, line.text)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

from higgsfield.contract.errors import NodeLost, RunError
from higgsfield.contract.runstatus import RunStatus
from higgsfield.control.backends.backend import LogLine
from higgsfield.control.config import Config
from higgsfield.control.remote import Group, Member
from higgsfield.control.remote.invoker import invoker_argv

HEARTBEAT_S = 5.0
LOST_AFTER_S = 30.0
WATCH_EVERY_S = 0.5     # how often a follower looks for silent or lost streams while lines flow
NOTICE = -2            # the rank of a LogLine that is this side's own notice (a re-attached stream), not a log
REATTACH_TRIES = 3     # attempts at the lost stream of a run's only node (one when other nodes' streams ended)


_End = tuple[str, int, BaseException | None]   # a stream ended: (node, its generation, its error or None)


class _Streams:
    """Every node's log stream of one run, with what re-attaching one needs: lines given, last heard, tries."""

    def __init__(self, cfg: Config, run: str, members: list[Member], args: list[str]) -> None:
        self.cfg, self.run, self.args = cfg, run, args
        self.members = {m.name: m for m in members}
        self.queue: asyncio.Queue[LogLine | _End] = asyncio.Queue(maxsize=10000)
        self.last_seen: dict[str, float] = {}
        self.given: dict[str, dict[int, int]] = {}   # node -> rank -> lines given (what a re-attached stream skips)
        self.generation: dict[str, int] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.open: set[str] = set(self.members)
        self.errors: dict[str, BaseException] = {}
        self.retry_at: dict[str, float] = {}
        self.tries: dict[str, int] = {}
        self.lost: str | None = None

    def attach(self, name: str) -> None:
        self.generation[name] = self.generation.get(name, 0) + 1
        self.tasks[name] = asyncio.create_task(self._pump(self.members[name], self.generation[name]))

    async def _pump(self, m: Member, gen: int) -> None:
        """Queue ``m``'s lines (those not given before), then its end: None, or the error that broke it."""
        seen = self.given.setdefault(m.name, {})
        skip = dict(seen)
        error: BaseException | None = None
        try:
            self.last_seen[m.name] = time.monotonic()
            async for raw in m.transport.stream([*invoker_argv(self.cfg, m.node), *self.args]):
                self.last_seen[m.name] = time.monotonic()
                if raw == "#hb":
                    continue
                head, _, text = raw.partition("\t")
                rank = int(head) if head.lstrip("-").isdigit() else -1
                if skip.get(rank, 0) > 0:
                    skip[rank] -= 1
                    continue
                seen[rank] = seen.get(rank, 0) + 1
                await self.queue.put(LogLine(m.name, rank, text))
        except Exception as e:  # noqa: BLE001 - surfaced to the reader
            error = e
        finally:
            await self.queue.put((m.name, gen, error))

    async def next(self, watch: bool) -> LogLine | _End | None:
        """The next queued item; None after a second of quiet when watching (the silence checks must run)."""
        # A line already queued is taken without a timer: wait_for costs about 20 us a line,
        # which capped a busy follower at a third of its speed.
        if not self.queue.empty():
            return self.queue.get_nowait()
        if not watch:
            return await self.queue.get()
        try:
            return await asyncio.wait_for(self.queue.get(), 1.0)
        except asyncio.TimeoutError:
            return None

    def ended(self, end: _End, *, watch: bool) -> LogLine | None:
        """A stream ended: the node is done, or (watching) it is to be re-attached; the notice saying so."""
        name, gen, err = end
        if gen != self.generation.get(name):
            return None   # a stream already given up for silence
        if err is None:
            self.open.discard(name)
            return None
        self.errors[name] = err
        if not watch:
            self.open.discard(name)
            return None
        self.retry_at[name] = time.monotonic() + min(5.0, 2.0 ** self.tries.get(name, 0))
        return LogLine(name, NOTICE, f"lost the log stream ({_why(err)}); re-attaching")

    def check(self, now: float, lost_after: float) -> Iterator[LogLine]:
        """Give up silent streams and re-attach those due; raise NodeLost for one that cannot come back."""
        for name in sorted(self.open):
            if name not in self.retry_at and now - self.last_seen.get(name, now) > lost_after:
                self.tasks[name].cancel()
                self.generation[name] += 1
                self.errors[name] = RunError(f"no answer for {now - self.last_seen[name]:.0f}s")
                self.retry_at[name] = now
                yield LogLine(name, NOTICE, f"no answer for {now - self.last_seen[name]:.0f}s; re-attaching")
            # Once every other stream has ended the run is over there, so over here too (its
            # nodes saw to it): one last try for this node's lines, at once, unless it runs alone.
            others_done = set(self.retry_at) >= self.open
            alone = len(self.members) == 1
            if name in self.retry_at and (now >= self.retry_at[name] or others_done and not alone):
                if others_done:
                    self.tries[name] = self.tries.get(name, 0) + 1
                    if self.tries[name] > (REATTACH_TRIES if alone else 1):
                        self.lost = name
                        raise NodeLost(name, _why(self.errors[name]), self.run)
                del self.retry_at[name]
                self.last_seen[name] = now
                self.attach(name)

    async def close(self) -> None:
        """Stop every stream; a node given up on also loses its connection, so a next command there starts afresh."""
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        if self.lost is not None:
            await self.members[self.lost].transport.close()


async def stream_logs(group: Group, cfg: Config, status: RunStatus, *, follow: bool = False,
                      node: str | None = None, ranks: tuple[int, ...] = (), lost_after: float | None = None,
                      since: float | None = None, current: bool = False) -> AsyncIterator[LogLine]:
    """Merge the per-rank lines of ``status``'s nodes (members of ``group``) as they arrive, until every stream ends.

    Each node sends every attempt of the run's name under its header line (``current``: only the last).

    ``since`` (a UNIX time of this machine's clock) is passed to every node as is:
    only lines written from then on by the node's clock (``higgsfield doctor``
    reports the skew); see :mod:`higgsfield.node.observe.logs`.

    Within a rank lines keep their order. A node whose logs cannot be read is
    reported after the other nodes' lines (RunError naming it). With ``lost_after``
    (following only), a node's stream that breaks or sends nothing, not even a
    heartbeat, for that many seconds is re-attached over the same transport (a
    ``NOTICE`` line says so): the node sends its logs again from the start and the
    lines already given are skipped, rank by rank, so none is lost or repeated. Once
    every other stream has ended, a stream that still cannot be re-attached raises
    :class:`NodeLost`.
    """
    want = None if node is None else str(cfg.node(node).name)   # its host alone will do
    names = [str(cfg.node(n).name) for n in status.nodes if want is None or cfg.node(n).name == want]
    if not names:
        raise RunError(f"run '{status.run}' does not run on node '{node}' (nodes: {', '.join(status.nodes)})")
    members = [m for m in group.members if m.name in names]
    missing = sorted(set(names) - {m.name for m in members})
    if missing:
        raise RunError(f"run '{status.run}' runs on {', '.join(missing)}, which this command did not connect")
    watch = bool(follow and lost_after)
    args = ["logs", "--project", cfg.name, "--run", status.run]
    args += ["--follow"] if follow else []
    args += ["--heartbeat", str(HEARTBEAT_S)] if watch else []
    args += ["--since", f"{since:.3f}"] if since is not None else []
    args += ["--current"] if current else []
    for r in ranks:
        args += ["--rank", str(r)]
    streams = _Streams(cfg, status.run, members, args)
    for m in members:
        streams.attach(m.name)
    next_check = 0.0
    try:
        while streams.open:
            item = await streams.next(watch)
            if isinstance(item, LogLine):
                streams.tries.pop(item.node, None)
                yield item
            elif item is not None:
                notice = streams.ended(item, watch=watch)
                if notice is not None:
                    yield notice
            if watch:
                now = time.monotonic()
                if isinstance(item, LogLine) and now < next_check:
                    continue  # the silence checks need not run for every line of a busy stream
                next_check = now + WATCH_EVERY_S
                for notice in streams.check(now, float(lost_after or 0)):
                    yield notice
    finally:
        await streams.close()
    if streams.errors and not watch:
        detail = "; ".join(f"{n}: {_why(e)}" for n, e in streams.errors.items())
        raise RunError(f"could not read the logs of run '{status.run}' on {len(streams.errors)} node(s): {detail}")


def follow(group: Group, cfg: Config, status: RunStatus, *, lost_after: float = LOST_AFTER_S,
           node: str | None = None, ranks: tuple[int, ...] = (), since: float | None = None,
           current: bool = False) -> AsyncIterator[LogLine]:
    """Follow a run's logs to its end over ``group``'s connections, re-attaching a stream that breaks.

    The very iterator of :func:`stream_logs` (not a wrapper), so closing it closes the streams at once.
    ``current``: only the run's current attempt (``run`` following its own start of a re-used name).
    """
    return stream_logs(group, cfg, status, follow=True, lost_after=lost_after, node=node, ranks=ranks, since=since,
                       current=current)


def _why(e: BaseException) -> str:
    reason = getattr(e, "reason", None)
    return str(reason or e) or type(e).__name__

"""One run's merged logs and step metrics, read once and shared by every page that shows the run.

A run page subscribes; the first subscriber starts the reads (the backend Session's
``logs(follow=True)`` and ``metrics(follow=True)``, over the dashboard's connections: the
calls behind ``higgsfield logs -f`` and ``higgsfield metrics -f``), later ones get what was
read so far (the last ``KEEP_LINES`` lines, every metrics point) and then the live
rest. Lines are batched for ``FLUSH_S`` (one event per batch, not per line). The
reads stop ``LINGER_S`` after the last subscriber left, or when the run ended and
everything was read (the buffers stay for the next viewer until the hub drops the
feed).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc

from higgsfield.contract.runstatus import RunStatus
from higgsfield.control.backends import Session
from higgsfield.control.backends.fleet import why
from higgsfield.metrics import Skipped, point

KEEP_LINES = 20000
FLUSH_S = 0.05
LINGER_S = 15.0
SUBSCRIBER_BACKLOG = 256     # events a slow page may lag behind before it is dropped (it reconnects)

Event = tuple[str, Any]


class RunFeed:
    """The shared reads of one run; ``on_idle`` is called when nobody watched it for ``LINGER_S``.

    The reads run in ``tasks`` (the hub's task group: they end with the hub at the latest), under a
    cancel scope of the feed's own that :meth:`close` cancels."""

    def __init__(self, session: Session, status: RunStatus, on_idle: Callable[[RunFeed], None],
                 tasks: anyio.abc.TaskGroup) -> None:
        self.tasks = tasks
        self.session = session
        self.status = status
        self.run = status.run
        self.on_idle = on_idle
        self.lines: deque[list[Any]] = deque(maxlen=KEEP_LINES)   # [node, rank, text, received (UNIX time)]
        self.dropped = 0
        self.points: list[dict[str, Any]] = []
        self.skipped = 0          # lines of the metrics file that were not a step's metrics (the page says so)
        self.logs_done = False
        self.metrics_done = False
        self.errors: list[str] = []
        self.subscribers: set[asyncio.Queue[Event]] = set()
        self._pending: list[list[Any]] = []
        self._flush: asyncio.TimerHandle | None = None
        self._reads: anyio.CancelScope | None = None
        self._read_done = anyio.Event()
        self._idle: asyncio.TimerHandle | None = None

    # -- subscribers --------------------------------------------------------------

    def subscribe(self) -> tuple[asyncio.Queue[Event], list[Event]]:
        """A queue of live events and the backlog to send first."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._reads is None:
            self._start()
        q: asyncio.Queue[Event] = asyncio.Queue(maxsize=SUBSCRIBER_BACKLOG)
        self.subscribers.add(q)
        backlog: list[Event] = [("meta", {"run": self.run, "dropped": self.dropped})]
        lines = list(self.lines)
        for i in range(0, len(lines), 2000):
            backlog.append(("lines", lines[i:i + 2000]))
        if self.points:
            backlog.append(("points", list(self.points)))
        if self.skipped:
            backlog.append(("skipped", {"count": self.skipped}))
        backlog += [("error", e) for e in self.errors]
        if self.logs_done:
            backlog.append(("logs_end", {}))
        if self.metrics_done:
            backlog.append(("metrics_end", {}))
        return q, backlog

    def unsubscribe(self, q: asyncio.Queue[Event]) -> None:
        self.subscribers.discard(q)
        if not self.subscribers and self._idle is None:
            self._idle = asyncio.get_running_loop().call_later(LINGER_S, self._go_idle)

    def _go_idle(self) -> None:
        self._idle = None
        if not self.subscribers:
            self.on_idle(self)

    def _send(self, event: Event) -> None:
        for q in list(self.subscribers):
            try:
                q.put_nowait(event)
            except asyncio.QueueFull:
                self.subscribers.discard(q)       # too slow: its page reconnects and starts from the backlog
                with contextlib.suppress(asyncio.QueueFull):
                    q.get_nowait()
                    q.put_nowait(("reset", {}))

    # -- reading --------------------------------------------------------------------

    def _start(self) -> None:
        self.lines.clear()
        self.points.clear()
        self.skipped = 0
        self.errors.clear()
        self.logs_done = self.metrics_done = False
        self._reads = anyio.CancelScope()
        self.tasks.start_soon(self._read, self._reads, name=f"feed-{self.run}")

    async def _read(self, scope: anyio.CancelScope) -> None:
        try:
            with scope:
                async with anyio.create_task_group() as reads:
                    reads.start_soon(self._logs, name=f"logs-{self.run}")
                    reads.start_soon(self._metrics, name=f"metrics-{self.run}")
        finally:
            self._read_done.set()

    async def close(self) -> None:
        if self._reads is not None:
            self._reads.cancel()
            await self._read_done.wait()
        if self._idle is not None:
            self._idle.cancel()
        for q in list(self.subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(("bye", {}))

    async def _logs(self) -> None:
        try:
            async for line in self.session.logs(self.status, follow=True):
                item = [line.node, line.rank, line.text, time.time()]
                if len(self.lines) == self.lines.maxlen:
                    self.dropped += 1
                self.lines.append(item)
                self._pending.append(item)
                if self._flush is None:
                    self._flush = asyncio.get_running_loop().call_later(FLUSH_S, self._flush_lines)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - shown on the page
            self._error(f"logs: {why(e)}")
        finally:
            self._flush_lines()
        self.logs_done = True
        self._send(("logs_end", {}))

    def _flush_lines(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if self._pending:
            batch, self._pending = self._pending, []
            self._send(("lines", batch))

    async def _metrics(self) -> None:
        try:
            async for m in self.session.metrics(self.status, follow=True):
                if m is None:
                    continue
                if isinstance(m, Skipped):
                    self.skipped = m.count
                    self._send(("skipped", {"count": m.count}))
                    continue
                p = point(m)
                self.points.append(p)
                self._send(("points", [p]))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - shown on the page
            self._error(f"metrics: {why(e)}")
        self.metrics_done = True
        self._send(("metrics_end", {}))

    def _error(self, text: str) -> None:
        self.errors.append(text)
        self._send(("error", text))

"""Node 0's word about its run: one message per event to each ``notify:`` destination, through apprise.

The run's supervisor on node 0 says :meth:`Notifier.event` when torchrun starts, when the watchdog
finds a stall, when a node is lost and the run goes on on its next attempt, and when the run ends
(:mod:`higgsfield.node.runs.supervisor`); after node 0 itself is lost, the new node 0's does. It never waits for a
send: messages go from a thread of their own, in order, each destination on its own so that one
dead webhook does not silence the others. A send that fails is one line in the run's launcher log,
naming the destination by its number and scheme only (``2 of 2, json://``): the URL is a secret
(:mod:`higgsfield.contract.notify`) and is written nowhere. apprise's own logger is silenced for
the same reason: its messages may quote a URL.

At most ``RATE`` messages go out in any ``WINDOW_S`` seconds (a run that stalls and recovers in a
loop must not flood a channel); the run's end is always sent. When the supervisor ends it gives
the thread ``FLUSH_S`` seconds to send what is left, so a run's last word is not lost to its exit,
and never more: a hung destination cannot hold the node's slots.

Why apprise: one maintained library speaks Slack, Discord, Teams, e-mail, ntfy, Telegram and a
plain JSON webhook (and 100 more) from one URL each; hand-written transports would be ours to keep.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from higgsfield.contract.failure import Failure, Verdict
from higgsfield.contract.notify import Event, Notify
from higgsfield.contract.states import FAILED, SUCCEEDED

RATE = 5              # messages ...
WINDOW_S = 60.0       # ... per this many seconds, the run's end excepted
FLUSH_S = 15.0        # how long a supervisor that ends waits for its last messages to go
TAIL_LINES = 5        # of an error, in a failure's message
FINAL: frozenset[Event] = frozenset({"succeeded", "failed"})


@dataclass(frozen=True)
class Note:
    """One event of one run, as every destination gets it (the title, then ``key: value`` lines)."""

    event: Event
    run: str
    project: str
    experiment: str
    node: str | None = None
    rank: int | None = None
    step: int | None = None
    detail: str = ""
    error: Sequence[str] = field(default_factory=tuple)

    @property
    def title(self) -> str:
        return f"higgsfield: run {self.run} {self.event}"

    @property
    def body(self) -> str:
        lines = [f"run: {self.run} (experiment {self.experiment}, project {self.project})", f"event: {self.event}"]
        if self.node is not None:
            lines.append(f"node: {self.node}" + (f", rank {self.rank}" if self.rank is not None else ""))
        if self.step is not None:
            lines.append(f"step: {self.step}")
        if self.detail:
            lines.append(self.detail)
        if self.error:
            lines += ["error:", *[f"  {ln}" for ln in list(self.error)[-TAIL_LINES:]]]
        return "\n".join(lines)


def _send(ap: Any, note: Note) -> bool:
    return bool(ap.notify(title=note.title, body=note.body))


def _scheme(url: str) -> str:
    return url.split("://", 1)[0] + "://" if "://" in url else "?"


class Notifier:
    """Sends :class:`Note` s to ``settings``' destinations from a thread; ``say`` writes the log line of a
    failed send. A notifier with no destination (or no wanted event) does nothing and starts no thread, nor
    does one whose ``speaks()`` is false (a node that is not node 0 now: only node 0 sends)."""

    def __init__(self, settings: Notify, say: Callable[[str], None], speaks: Callable[[], bool] = lambda: True) -> None:
        self.settings, self.say, self.speaks = settings, say, speaks
        self._queue: queue.Queue[Note | None] = queue.Queue()
        self._sent: deque[float] = deque()
        self._dropped = 0
        self._thread: threading.Thread | None = None

    def event(self, msg: Note) -> None:
        """Queue ``msg`` if its event is wanted and within the rate (the run's end always is); never blocks."""
        if not self.settings.wants(msg.event) or not self.speaks():
            return
        now = time.monotonic()
        while self._sent and now - self._sent[0] > WINDOW_S:
            self._sent.popleft()
        if len(self._sent) >= RATE and msg.event not in FINAL:
            self._dropped += 1
            return
        self._sent.append(now)
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="higgsfield-notify", daemon=True)
            self._thread.start()
        self._queue.put(msg)

    def close(self, timeout: float = FLUSH_S) -> None:
        """Let the queued messages go, for at most ``timeout`` seconds."""
        if self._dropped:
            self.say(f"notify: {self._dropped} message(s) not sent: at most {RATE} in {WINDOW_S:.0f} s")
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.say(f"notify: gave up on the messages still unsent after {timeout:.0f} s")

    def _loop(self) -> None:
        senders, total = self._senders(), len(self.settings.urls)
        while (msg := self._queue.get()) is not None:
            for i, url, send in senders:
                try:
                    ok = send(msg)
                except Exception as e:  # noqa: BLE001 - a destination never breaks the run
                    ok, why = False, type(e).__name__
                else:
                    why = "refused or unreachable"
                if not ok:
                    self.say(f"notify: {msg.event!r} not sent to destination {i} of {total} ({_scheme(url)}): {why}")

    def _senders(self) -> list[tuple[int, str, Callable[[Note], bool]]]:
        """One apprise object per destination, so each one's failure is its own."""
        try:
            import apprise
        except ImportError:
            self.say("notify: apprise is not installed on this node: run 'higgsfield setup'")
            return []
        logging.getLogger("apprise").disabled = True   # its lines may quote a URL, which is a secret
        out: list[tuple[int, str, Callable[[Note], bool]]] = []
        for i, url in enumerate(self.settings.urls, 1):
            ap = apprise.Apprise()
            if not ap.add(url):
                self.say(f"notify: destination {i} of {len(self.settings.urls)} ({_scheme(url)}) is not an "
                         "apprise URL: fix its value in the env file or the CI secrets")
                continue
            out.append((i, url, functools.partial(_send, ap)))
        return out


def ending(state: str, own: Failure | None, verdict: Verdict | None) -> tuple[Event, Failure | None] | None:
    """The run's end to tell of, as node 0's coordinator saw it: another node's failure fails the run even
    when node 0's part succeeded (``failed`` and that failure); ``succeeded``; None for a kill."""
    fail = verdict.failure if verdict is not None and verdict.kind == "failed" else None
    if fail is None and state == FAILED:
        fail = own
    if fail is not None:
        return "failed", fail
    return ("succeeded", None) if state == SUCCEEDED else None


def tell_end(notifier: Notifier, note: Callable[..., Note], state: str, own: Failure | None,
             verdict: Verdict | None) -> None:
    """The run's end as the coordinator saw it (a kill is no news to whoever killed it); a run that ends for a
    lost node also tells ``lost`` (one that goes on tells it at its regroup)."""
    end = ending(state, own, verdict)
    if end is None:
        return
    event, fail = end
    if fail is None:
        notifier.event(note(event))
        return
    if fail.lost:
        notifier.event(note("lost", node=fail.node, detail=fail.reason))
    notifier.event(note(event, node=fail.node, rank=fail.rank, detail=fail.reason, error=fail.tail))


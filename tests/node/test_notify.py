"""Node 0's messages through real apprise to a real webhook on loopback (``json://``): what a message says,
which events go, the rate, a dead or a hung destination, and that a URL is never written anywhere.

The end to end case (2 bed nodes, the laptop gone, both runtimes) is tests/faults/test_stall.py.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from higgsfield.contract.notify import Notify
from higgsfield.node.runs.notify import RATE, Note, Notifier

pytestmark = pytest.mark.timeout(60)


class Hook:
    """A webhook that keeps the JSON apprise posts; ``delay`` seconds before each answer (a hung one)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.posts: list[dict[str, Any]] = []
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                hook.posts.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
                time.sleep(delay)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"json://127.0.0.1:{self.server.server_address[1]}/secret-path-{id(self)}"


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.server.shutdown()


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"json://127.0.0.1:{s.getsockname()[1]}/nobody-listens"


def test_a_failure_names_run_node_rank_step_and_the_errors_last_lines(hook: Hook) -> None:
    said: list[str] = []
    n = Notifier(Notify((hook.url,), ("failed", "succeeded")), said.append)
    n.event(Note("started", "r1", "p", "e"))                       # not among the events asked for
    n.event(Note("failed", "r1", "p", "e", node="gpu-2", rank=3, step=120, detail="exit 1",
                 error=[f"line {i}" for i in range(9)] + ["ValueError: boom"]))
    n.close(10)
    (post,) = hook.posts
    assert post["title"] == "higgsfield: run r1 failed", post
    assert post["message"].splitlines() == [
        "run: r1 (experiment e, project p)", "event: failed", "node: gpu-2, rank 3", "step: 120", "exit 1", "error:",
        "  line 5", "  line 6", "  line 7", "  line 8", "  ValueError: boom"], post["message"]
    assert said == []


def test_a_dead_destination_is_one_line_without_its_url_and_the_others_still_get_word(hook: Hook) -> None:
    said: list[str] = []
    dead = _dead_url()
    n = Notifier(Notify((dead, "not a url at all", hook.url), ("succeeded",)), said.append)
    n.event(Note("succeeded", "r2", "p", "e"))
    n.close(10)
    assert [p["title"] for p in hook.posts] == ["higgsfield: run r2 succeeded"]
    assert said == ["notify: destination 2 of 3 (?) is not an apprise URL: fix its value in the env file or the "
                    "CI secrets",
                    "notify: 'succeeded' not sent to destination 1 of 3 (json://): refused or unreachable"], said
    assert not any("nobody-listens" in s or "secret-path" in s for s in said)


def test_at_most_rate_messages_a_minute_but_the_end_always_goes(hook: Hook) -> None:
    said: list[str] = []
    n = Notifier(Notify((hook.url,), ("stalled", "failed")), said.append)
    for _ in range(RATE + 3):
        n.event(Note("stalled", "r3", "p", "e"))
    n.event(Note("failed", "r3", "p", "e"))
    n.close(10)
    assert [p["title"].split()[-1] for p in hook.posts] == ["stalled"] * RATE + ["failed"]
    assert said == [f"notify: 3 message(s) not sent: at most {RATE} in 60 s"], said


def test_a_hung_destination_never_holds_the_supervisor_past_the_flush() -> None:
    slow = Hook(delay=30)
    said: list[str] = []
    try:
        n = Notifier(Notify((slow.url,), ("succeeded",)), said.append)
        n.event(Note("succeeded", "r4", "p", "e"))
        t0 = time.monotonic()
        n.close(1.0)
        assert time.monotonic() - t0 < 3
        assert said == ["notify: gave up on the messages still unsent after 1 s"], said
    finally:
        slow.server.shutdown()


def test_no_destination_no_thread() -> None:
    n = Notifier(Notify(), lambda s: None)
    n.event(Note("failed", "r5", "p", "e"))
    n.close(1)
    assert n._thread is None


def test_the_end_told_is_the_runs_as_node_0_saw_it() -> None:
    from higgsfield.contract.failure import Failure, Verdict
    from higgsfield.node.runs.notify import ending

    elsewhere = Failure("gpu-2", 3, 10.0, "rank 3: ValueError: x")
    assert ending("succeeded", None, None) == ("succeeded", None)
    assert ending("succeeded", None, Verdict("failed", elsewhere)) == ("failed", elsewhere)   # its part did well
    own = Failure("gpu-1", 0, 9.0, "rank 0: exited 1")
    assert ending("failed", own, None) == ("failed", own)
    assert ending("killed", None, Verdict("killed", node="gpu-1")) is None   # no news to whoever killed it


def test_a_run_ended_by_a_lost_node_tells_lost_then_failed_and_a_silent_node_tells_nothing(hook: Hook) -> None:
    from functools import partial

    from higgsfield.contract.failure import Failure, Verdict
    from higgsfield.node.runs.notify import tell_end

    lost = Failure("gpu-3", None, time.time(), "node gpu-3 was lost: connection closed", lost=True)
    n = Notifier(Notify((hook.url,), ("lost", "failed")), lambda _m: None)
    tell_end(n, partial(Note, run="r2", project="p", experiment="e"), "failed", None, Verdict("failed", lost))
    quiet = Notifier(Notify((hook.url,), ("lost", "failed")), lambda _m: None, speaks=lambda: False)   # not node 0
    tell_end(quiet, partial(Note, run="r3", project="p", experiment="e"), "failed", None, Verdict("failed", lost))
    n.close(10)
    quiet.close(10)
    assert [p["title"] for p in hook.posts] == ["higgsfield: run r2 lost", "higgsfield: run r2 failed"], hook.posts
    assert "node: gpu-3" in hook.posts[0]["message"]

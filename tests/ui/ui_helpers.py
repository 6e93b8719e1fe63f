"""Helpers of the dashboard's browser tests: a real ``higgsfield ui`` process and the page's parts."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INDICES = (15, 16, 17)   # the cluster tests' hosts hfnode15..17 (127.0.0.17-19): nobody else's on the shared bed
URL = re.compile(r"^http://127\.0\.0\.1:(\d+)/\?token=(\S+)$")


@dataclass
class Dashboard:
    proc: subprocess.Popen[str]
    url: str
    port: int
    token: str
    stderr: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def dashboard(project: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> Iterator[Dashboard]:
    """``higgsfield ui --port 0 --no-browser`` in ``project`` until the block ends (then SIGINT, then kill)."""
    proc = subprocess.Popen([sys.executable, "-m", "higgsfield", "ui", "--port", "0", "--no-browser", *args],
                            cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    assert proc.stdout is not None and proc.stderr is not None
    err: list[str] = []
    threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
    deadline = time.monotonic() + timeout
    url = None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if URL.match(line.strip()):
            url = line.strip()
            break
    if url is None:
        proc.kill()
        raise AssertionError(f"higgsfield ui printed no URL (exit {proc.wait()}): {''.join(err)[-2000:]}")
    m = URL.match(url)
    assert m
    d = Dashboard(proc, url, int(m.group(1)), m.group(2), err)
    try:
        yield d
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def open_page(browser: Any, d: Dashboard, view: str = "") -> Any:
    """A new page logged in with the URL's token, showing ``view`` (``#runs``, ``#nodes``, ``#run/NAME``)."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.on("dialog", lambda dialog: dialog.accept())   # "Kill RUN on every node?"
    page.goto(d.url)
    page.wait_for_selector("#live.on", timeout=15000)
    if view:
        page.evaluate(f"location.hash = {view!r}")
    return page


def row(page: Any, run: str) -> Any:
    return page.locator(f'#runs tbody tr[data-run="{run}"]')


def shoot(page: Any, name: str, default_dir: Path) -> Path:
    """A screenshot of what the user sees, in ``$HF_UI_SHOTS`` (docs/screenshots is made so) or ``default_dir``."""
    where = Path(os.environ.get("HF_UI_SHOTS") or default_dir)
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{name}.png"
    page.screenshot(path=str(path), full_page=False)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return path


def wait_for(pred: Any, timeout: float, what: str, poll: float = 0.1) -> Any:
    """Poll ``pred`` from Python (the page's CSP forbids the string predicates of wait_for_function)."""
    from runs_helpers import wait_for as poll_until  # tests/runs is on sys.path (tests/ui/conftest.py)

    return poll_until(pred, timeout, what, poll)

"""Helpers of the dashboard's browser tests: a real ``higgsfield ui`` process and the page's parts."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/lib/chromium/chromium"
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


def chromium_path() -> str:
    """Debian's Chromium (installed by the test bed's apt step or ``make chromium``; never ``playwright install``)."""
    import pytest

    path = os.environ.get("CHROMIUM") or (CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"))
    if not path or not Path(path).exists():
        pytest.fail("no Chromium: apt-get install -y chromium (make chromium does it), or set CHROMIUM=")
    return path


@contextlib.contextmanager
def launch_browser() -> Iterator[Any]:
    """Headless Chromium through Playwright until the block ends. Hold it for one test module, not longer:
    Playwright's sync API keeps an event loop running in the main thread while it is open, and every later
    test that calls asyncio.run in-process (the CLI's own commands) would fail with "cannot be called from
    a running event loop"."""
    import pytest

    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def start_from_form(page: Any, experiment: str, values: dict[str, str]) -> str:
    """Start ``experiment`` from the page's "New run" form with ``values``; the run's name (its page opens)."""
    from playwright.sync_api import expect

    page.evaluate("location.hash = '#runs'")
    page.select_option("#new-exp", experiment)
    page.click("#new-run")
    for name, value in values.items():
        page.fill(f"#ff-{name}", value)
    page.click("#form-start")
    expect(page).to_have_url(re.compile(r"#run/"), timeout=30000)
    return str(page.evaluate("decodeURIComponent(location.hash.slice(5))"))

"""The run page's "Profile 3 steps" (``higgsfield profile`` from the dashboard), in a real browser against a
``localhost`` node (real torchrun, two ranks, processes, no SSH): the button profiles the live run, each
rank's shares show, and the merged timeline it links holds both ranks."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers_project import local_project
from profile_helpers import STEPS
from ui_helpers import Dashboard, dashboard, open_page, shoot, wait_for

pytest.importorskip("starlette")
pytest.importorskip("playwright")
pytest.importorskip("torch")

from playwright.sync_api import expect  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

RUN = "prof-ui"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return local_project(tmp_path_factory.mktemp("uiprof"), "uiprof", {"steps.py": STEPS}, nproc=2)


@pytest.fixture(scope="module")
def ui(project: Path) -> Iterator[Dashboard]:
    with dashboard(project) as d:
        yield d


def test_profile_3_steps_from_the_run_page_links_the_merged_timeline(browser: Any, ui: Dashboard, project: Path,
                                                                      tmp_path: Path) -> None:
    import subprocess

    from higgsfield.control.ui.security import cookie_name

    r = subprocess.run([sys.executable, "-m", "higgsfield", "run", "steps", "--run-name", RUN, "-d", "-p",
                        "steps=100000", "-p", "step_sleep=0.05", "-p", "gate=enough"], cwd=project,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    run_dir = project.parent / "state" / "runs" / "uiprof" / RUN
    try:
        wait_for(lambda: "step 3 loss" in (run_dir / "logs" / "rank1.log").read_text(errors="replace")
                 if (run_dir / "logs" / "rank1.log").exists() else False, 90, "rank 1's step 3")
        page = open_page(browser, ui)
        page.evaluate(f"location.hash = '#run/{RUN}'")
        expect(page.locator("#run-state")).to_have_text("running", timeout=20000)
        page.locator("#profile-take").click()
        link = page.locator("#profile a")
        expect(link).to_have_count(1, timeout=60000)
        text = page.locator("#profile").inner_text()
        assert "localhost/0: 3 step(s)" in text and "localhost/1: 3 step(s)" in text, text
        shoot(page, "run-profile", tmp_path)
        href = link.get_attribute("href")
        req = urllib.request.Request(ui.base + href, headers={"cookie": f"{cookie_name(ui.port)}={ui.token}"})
        with urllib.request.urlopen(req, timeout=30) as resp:   # noqa: S310 - our own loopback server
            merged = json.loads(resp.read())
        names = {e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"}
        assert {"localhost rank 0", "localhost rank 1"} <= names, names
        page.close()
    finally:
        (run_dir / "enough").write_text("")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (run_dir / "logs" / "rank0.done").exists():
        time.sleep(0.2)

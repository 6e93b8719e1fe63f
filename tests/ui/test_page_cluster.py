"""The dashboard in a real browser over a real 3-node cluster (the test bed's sshd hosts hfnode15..17,
Docker runtime): one ``higgsfield ui`` and one page for the whole module.

What the issue asks, in the order a user meets it: the token and CSRF guard; a run that waits for its
slots shows its queue place, then moves queued -> running -> succeeded on its own while its ranks' lines
reach the page within 1 s and its loss curve gains points; kill from the page stops it on every node; a
failed run names its node and rank; and with a node down the page says so within 10 s and goes on working.
Screenshots go to ``$HF_UI_SHOTS`` (``HF_UI_SHOTS=docs/screenshots`` refreshes the README's).
"""

from __future__ import annotations

import http.client
import json
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ui_helpers import INDICES, Dashboard, dashboard, open_page, row, shoot, wait_for

pytest.importorskip("starlette")
pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402
from runs_helpers import SECRET, STATE, containers, run_processes  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.sshd, pytest.mark.docker, pytest.mark.timeout(600)]
NODES = [f"hfnode{i}" for i in INDICES]
# The hosts keep earlier sessions' runs of project hfui, and a run name used again resumes that run:
# this session's names are its own.
SUFFIX = secrets.token_hex(2)
BLOCK, MAIN, KILL, FAIL, TWO = (f"ui-{n}-{SUFFIX}" for n in ("block", "main", "kill", "fail", "two"))
TICK = re.compile(r"tick (\d+\.\d+) rank (\d+)")


def run_dir(i: int, run: str) -> Path:
    return Path(f"/home/hfnode{i}") / STATE / "runs" / "hfui" / run


@pytest.fixture(scope="module")
def ui(ui_cluster: Any) -> Iterator[Dashboard]:
    with dashboard(ui_cluster.dir) as d:
        yield d


@pytest.fixture(scope="module")
def page(browser: Any, ui: Dashboard) -> Iterator[Any]:
    p = open_page(browser, ui, "#runs")
    yield p
    p.close()


def _get(d: Dashboard, path: str, headers: dict[str, str] | None = None, method: str = "GET",
         body: bytes | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read() if path.find("/events") < 0 else r.read(2000)
    finally:
        conn.close()


def test_without_the_token_or_csrf_nothing_and_no_secret_ever(ui: Dashboard, ui_cluster: Any) -> None:
    assert _get(ui, "/")[0] == 403
    assert _get(ui, "/api/events")[0] == 403
    assert _get(ui, "/api/runs/x/kill", method="POST")[0] == 403
    cookie = {"cookie": f"hf_ui_{ui.port}={ui.token}"}
    assert _get(ui, "/api/runs/x/kill", {**cookie, "x-hf-csrf": "wrong"}, "POST")[0] == 403
    assert _get(ui, "/api/runs/x/kill", {**cookie, "host": "evil.example"}, "POST")[0] == 403
    status, session = _get(ui, "/api/session", cookie)
    assert status == 200
    csrf = json.loads(session)["csrf"]
    status, body = _get(ui, "/api/runs/x/kill", {**cookie, "x-hf-csrf": csrf}, "POST")
    assert status == 400 and b"no run or experiment named 'x'" in body     # passed the guard: the CLI's message
    seen = session + _get(ui, "/api/events", cookie)[1] + _get(ui, "/static/app.js", cookie)[1]
    assert SECRET.encode() not in seen and b"BEGIN OPENSSH" not in seen


def test_a_waiting_run_shows_its_place_then_runs_to_success_live(page: Any, browser: Any, ui: Dashboard,
                                                                 ui_cluster: Any, tmp_path: Path) -> None:
    c = ui_cluster
    c.hf("run", "ticker", "-p", "gate=open", "--exclusive", "--run-name", BLOCK, "--detach", check=True)
    c.hf("run", "ticker", "-p", "steps=30", "-p", "every=0.25", "--run-name", MAIN, "--detach", check=True)
    expect(row(page, BLOCK).locator(".state")).to_have_text("running", timeout=60000)
    expect(row(page, MAIN).locator(".state")).to_have_text("queued", timeout=30000)
    expect(row(page, MAIN).locator(".queue")).to_have_text("#1 waiting")
    shoot(page, "runs-queue", tmp_path)

    run_page = open_page(browser, ui, f"#run/{MAIN}")
    try:
        expect(run_page.locator("#run-state")).to_have_text("queued", timeout=15000)
        states = [row(page, MAIN).get_attribute("data-state")]
        for i in INDICES:   # the blocker ends; ui-main starts by itself
            (run_dir(i, BLOCK) / "open").touch()
        latencies: list[float] = []
        counts: list[int] = []
        seen: set[tuple[str, str]] = set()
        deadline = time.monotonic() + 180
        while states[-1] != "succeeded" and time.monotonic() < deadline:
            s = row(page, MAIN).get_attribute("data-state")
            if s != states[-1]:
                states.append(s)
            lines = run_page.evaluate("[...document.querySelectorAll('#log .line')].slice(-12).map(e => e.textContent)")
            now = time.time()
            for text in lines:
                m = TICK.search(text)
                if m and (m.group(1), m.group(2)) not in seen:
                    seen.add((m.group(1), m.group(2)))
                    latencies.append(now - float(m.group(1)))
            n = int(run_page.locator("#points").get_attribute("data-points") or 0)
            if not counts or n != counts[-1]:
                counts.append(n)
            time.sleep(0.05)
        assert states[0] == "queued" and states[-1] == "succeeded", states
        assert "running" in states, states
        assert {r for _, r in seen} == {"0", "1", "2"}, "every rank's lines reach the page"
        latencies.sort()
        p99 = latencies[int(0.99 * (len(latencies) - 1))]
        print(f"log line to page: {len(latencies)} lines, median {latencies[len(latencies) // 2]:.3f}s, "
              f"p99 {p99:.3f}s, max {latencies[-1]:.3f}s")
        assert latencies[-1] < 1.0, latencies[-10:]
        assert len([n for n in counts if 0 < n < 30]) >= 3, f"the curve grows as it trains: {counts}"
        expect(run_page.locator("#points")).to_have_attribute("data-points", "30", timeout=15000)
        shoot(run_page, "run", tmp_path)
    finally:
        run_page.close()


def test_kill_from_the_page_stops_the_run_on_every_node(page: Any, ui_cluster: Any) -> None:
    ui_cluster.hf("run", "ticker", "-p", "gate=never", "--run-name", KILL, "--detach", check=True)
    r = row(page, KILL)
    expect(r.locator(".state")).to_have_text("running", timeout=60000)
    wait_for(lambda: all(run_processes(run_dir(i, KILL)) for i in INDICES), 30, "every node's workers")
    t0 = time.monotonic()
    r.locator(".kill").click()
    expect(r.locator(".state")).to_have_text("killed", timeout=20000)
    wait_for(lambda: not any(run_processes(run_dir(i, KILL)) for i in INDICES) and not containers(KILL),
             15, "nothing of the run left on any node")
    print(f"kill from the page to nothing left: {time.monotonic() - t0:.2f}s")
    # The page says "killed" as soon as one node's record does, and run_processes does not see the
    # supervisors (no HIGGSFIELD_RUN_DIR in their environment): each node's supervisor writes its own final
    # record a moment after its processes are gone (one stopped by the coordinator's abort first waits up to
    # 3 s for the verdict; `invoker kill` finishes a record itself if its supervisor does not). Bounded and
    # strict: a record that never reads "killed" fails here, naming every node's state.
    killed = {n: "killed" for n in NODES}
    deadline = time.monotonic() + 15
    while (states := _states(KILL)) != killed and time.monotonic() < deadline:
        time.sleep(0.1)
    assert states == killed, f"every node's record final as killed within 15 s: {states}"
    print(f"kill from the page to every node's record final: {time.monotonic() - t0:.2f}s")


def _states(run: str) -> dict[str, str | None]:
    """Each node's recorded state of ``run`` (None while its run.json is missing or being replaced)."""
    out: dict[str, str | None] = {}
    for n, i in zip(NODES, INDICES, strict=True):
        try:
            out[n] = json.loads((run_dir(i, run) / "run.json").read_text())["state"]
        except (OSError, ValueError, KeyError):
            out[n] = None
    return out


def test_a_failed_run_shows_its_node_and_rank(page: Any, ui_cluster: Any) -> None:
    ui_cluster.hf("run", "ticker", "-p", "steps=40", "-p", "fail_rank=2", "--run-name", FAIL, "--detach",
                  check=True)
    r = row(page, FAIL)
    expect(r.locator(".state")).to_have_text("failed", timeout=90000)
    expect(r.locator(".failure")).to_contain_text(f"{NODES[2]} rank 2")
    expect(r.locator(".failure")).to_contain_text("ticker failure on rank 2")


def test_the_page_works_with_a_node_down(page: Any, ui_bed: Any, ui_cluster: Any, tmp_path: Path) -> None:
    page.evaluate("location.hash = '#nodes'")
    victim = ui_bed.make_host(INDICES[2])
    card = page.locator(f'.node[data-node="{NODES[2]}"] .node-state')
    expect(card).to_have_text("up", timeout=15000)
    try:
        t0 = time.monotonic()
        ui_bed.stop_host(victim, kill_sessions=True)
        expect(card).to_have_text("not answering", timeout=10000)
        print(f"node down to page: {time.monotonic() - t0:.2f}s")
        for name in NODES[:2]:
            expect(page.locator(f'.node[data-node="{name}"] .node-state')).to_have_text("up")
        shoot(page, "nodes", tmp_path)
        page.evaluate("location.hash = '#runs'")
        expect(row(page, MAIN).locator(".state")).to_have_text("succeeded")   # last known, still listed
        ui_cluster.hf("run", "ticker", "-p", "steps=4", "--nodes", "2", "--run-name", TWO, "--detach",
                      check=True)
        expect(row(page, TWO).locator(".state")).to_have_text("succeeded", timeout=90000)
        shoot(page, "runs", tmp_path)
    finally:
        ui_bed.start_host(victim)
    page.evaluate("location.hash = '#nodes'")
    expect(card).to_have_text("up", timeout=30000)

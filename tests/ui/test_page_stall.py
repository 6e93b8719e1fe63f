"""A new project's first run has curves, and a hung run is found, shown and explained (issue 18), in a real
browser against a ``localhost`` node (real torchrun, two ranks, processes, no SSH).

The project is what ``higgsfield init`` writes (its example experiment reports its steps
through the library), plus the frozen-rank experiment of the issue: rank 1 sleeps forever
at step 5 while rank 0 waits in ``all_reduce``. One dashboard, one page:

- the scaffold's example trains and its run page draws the loss curve;
- ``on_stall: wait``: the runs table marks the run stalled, its page shows the diagnosis's
  groups and "take stacks now" takes every rank's stack live; ``status`` says it too;
- ``on_stall: fail``: ``run`` ends failed, its closing lines name the odd rank and where it
  is, and ``higgsfield stacks`` prints the stacks saved at the stall.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers_project import cli_env
from ui_helpers import Dashboard, dashboard, open_page, row, shoot

pytest.importorskip("starlette")
pytest.importorskip("playwright")
pytest.importorskip("torch")
from playwright.sync_api import expect  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

FROZEN = '''
import time

import torch
import torch.distributed as dist

from higgsfield.experiment import experiment, param
from higgsfield.training import progress


def next_batch(rank, step, freeze_at):
    if rank == 1 and step == freeze_at:   # the frozen rank
        time.sleep(3600)
    return torch.ones(1)


@experiment("frozen")
@param("freeze_at", default=5)
def frozen(params):
    dist.init_process_group("gloo")
    for step in range(1, 100000):
        x = next_batch(params.rank, step, params.freeze_at)
        dist.all_reduce(x)
        progress(step)
        print(f"step {step}", flush=True)
        time.sleep(0.1)
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``higgsfield init demo`` (the real CLI), on this machine's localhost node with two ranks."""
    base = tmp_path_factory.mktemp("uistall")
    home = base / "home"
    subprocess.run([sys.executable, "-m", "higgsfield", "init", "demo"], cwd=base, env=cli_env(home),
                   capture_output=True, text=True, timeout=120, check=True)
    proj = base / "demo"
    cfg = proj / "higgsfield.yml"
    text = cfg.read_text().replace("nproc_per_node: auto", "nproc_per_node: 2").replace("runtime: auto",
                                                                                         "runtime: process")
    cfg.write_text(text + f"state_dir: {base / 'state'}\n")
    (proj / "src" / "frozen.py").write_text(FROZEN)
    return proj, home


def hf(project: tuple[Path, Path], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proj, home = project
    return subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=proj,
                          env=cli_env(home, COLUMNS="200", TERM="dumb", OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def ui(project: tuple[Path, Path]) -> Iterator[Dashboard]:
    with dashboard(project[0], env=cli_env(project[1])) as d:
        yield d


@pytest.fixture(scope="module")
def page(browser: Any, ui: Dashboard) -> Iterator[Any]:
    p = open_page(browser, ui)
    yield p
    p.close()


def test_the_scaffolds_first_run_has_a_loss_curve(page: Any, project: tuple[Path, Path], tmp_path: Path) -> None:
    r = hf(project, "run", "example", "-p", "steps=30", "--run-name", "first", timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step   30  loss" in r.stdout
    page.evaluate("location.hash = '#run/first'")
    expect(page.locator("#run-state")).to_have_text("succeeded", timeout=20000)
    expect(page.locator("#points")).to_have_attribute("data-points", "30", timeout=20000)
    expect(page.locator('.chart[data-curve="loss"] canvas')).to_have_count(1)
    shoot(page, "scaffold-first-run", tmp_path)
    steps = [json.loads(x) for x in hf(project, "metrics", "first", "--json").stdout.splitlines()]
    assert [s["step"] for s in steps] == list(range(1, 31)) and steps[-1]["loss"] < steps[0]["loss"]


def test_the_stacks_action_is_guarded_and_refuses_in_one_line(ui: Dashboard) -> None:
    import urllib.error
    import urllib.request

    from higgsfield.control.ui.security import CSRF_HEADER, cookie_name, csrf_token

    def post(path: str, **headers: str) -> tuple[int, str]:
        req = urllib.request.Request(ui.base + path, data=b"{}", method="POST",
                                     headers={"content-type": "application/json",
                                              "cookie": f"{cookie_name(ui.port)}={ui.token}", **headers})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:   # noqa: S310 - our own loopback server
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    csrf = {CSRF_HEADER: csrf_token(ui.token)}
    assert post("/api/runs/first/stacks")[0] == 403                                  # no CSRF header
    assert post("/api/runs/first/stacks", **csrf, Host="evil.example:80")[0] == 403  # another Host
    code, body = post("/api/runs/first/stacks", **csrf)
    assert code == 400 and json.loads(body) == {"error": "run 'first' is succeeded, not running, and saved no "
                                                         "stacks (only a run that stalled keeps them)"}
    code, body = post("/api/runs/nosuch/stacks", **csrf)
    assert code == 400 and json.loads(body)["error"].startswith("no run named 'nosuch'")
    assert post("/api/runs/.hidden/stacks", **csrf)[0] == 404


def test_a_stalled_run_is_marked_explained_and_its_stacks_taken(page: Any, project: tuple[Path, Path],
                                                                tmp_path: Path) -> None:
    r = hf(project, "run", "frozen", "-d", "--run-name", "frozen-wait", "--stall-timeout", "4",
           "--on-stall", "wait")
    assert r.returncode == 0, r.stderr
    try:
        t0 = time.monotonic()
        page.evaluate("location.hash = '#runs'")
        expect(row(page, "frozen-wait").locator(".state")).to_have_text("stalled", timeout=60000)
        print(f"\nfrozen-wait: stalled shown {time.monotonic() - t0:.1f}s after the start")
        expect(row(page, "frozen-wait")).to_have_class(re.compile(r"\bstalled\b"))
        expect(row(page, "frozen-wait").locator(".failure")).to_contain_text(
            "stalled: localhost/0 waits in all_reduce at frozen.py:")
        shoot(page, "stalled-runs", tmp_path)
        page.evaluate("location.hash = '#run/frozen-wait'")
        expect(page.locator("#run-stall")).to_contain_text("localhost/1 is at frozen.py:13 `time.sleep(3600)`")
        odd = page.locator("#stacks .group.odd")
        expect(odd).to_have_attribute("data-ranks", "localhost/1")
        expect(odd.locator("pre")).to_contain_text("in next_batch")
        expect(page.locator("#stacks .group.most pre")).to_contain_text("in all_reduce")
        # "take stacks now": every rank's stack, live, through the backend
        page.click("#stacks-take")
        expect(page.locator("#stacks-note")).to_contain_text("taken", timeout=20000)
        expect(page.locator("#stacks details.rank")).to_have_count(2)
        expect(page.locator('#stacks details.rank[data-rank="localhost/1"] pre')).to_contain_text("time.sleep(3600)")
        shoot(page, "stalled-run", tmp_path)
        # the terminal says the same
        s = hf(project, "status")
        assert re.search(r"^frozen-wait +frozen +stalled ", s.stdout, re.M), s.stdout
        assert "frozen-wait: stalled:\n  stalled: localhost/0 waits in all_reduce at frozen.py:" in s.stdout
        k = hf(project, "kill", "frozen-wait")
        assert k.returncode == 0 and "frozen-wait: killed" in k.stdout, k.stderr
        expect(page.locator("#run-state")).to_have_text("killed", timeout=20000)
    finally:   # a run that waits on its stall runs until killed: never leave it behind
        hf(project, "kill", "frozen-wait")


def test_a_run_failed_by_its_stall_names_the_odd_rank_and_keeps_its_stacks(project: tuple[Path, Path]) -> None:
    t0 = time.monotonic()
    r = hf(project, "run", "frozen", "--run-name", "frozen-fail", "--stall-timeout", "4", timeout=180)
    took = time.monotonic() - t0
    assert r.returncode != 0, r.stdout[-2000:]
    err = r.stderr
    assert "run frozen-fail failed" in err, err
    assert "  stalled: localhost/0 waits in all_reduce at frozen.py:" in err, err
    assert "    odd: localhost/1 at frozen.py:13 `time.sleep(3600)`" in err, err
    assert "every rank's stack at the stall: higgsfield stacks frozen-fail" in err
    print(f"\nfrozen-fail: failed by its stall in {took:.1f}s (stall_timeout 4 s)")
    st = hf(project, "stacks", "frozen-fail")
    assert st.returncode == 0, st.stderr
    assert "stacks saved at its stall" in st.stderr
    assert st.stdout.startswith("localhost/0 waits in all_reduce at frozen.py:")
    assert "== localhost/0 (pid " in st.stdout and "== localhost/1 (pid " in st.stdout
    j = json.loads(hf(project, "status", "--json").stdout)
    (run,) = [x for x in j["runs"] if x["run"] == "frozen-fail"]
    assert run["state"] == "failed" and run["reason"].startswith("stalled: ")
    assert run["stall"]["odd"] == ["localhost/1"]

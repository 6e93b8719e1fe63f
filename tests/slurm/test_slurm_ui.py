"""The dashboard of a Slurm project, in a real browser, on the real cluster (issue 12, item 7).

The project is set up and deployed through the real CLI (nothing placed by hand): by the journey,
whose project these tests reuse when it ran first in the session and got through its deploy (this
file's name sorts after test_slurm_journey.py for that), or here, which costs a minute more (mostly
the project environment). Then one ``higgsfield ui`` serves the module. The page must see Slurm runs
like any others, through the Slurm backend:

- a run started from the page's typed form is submitted as a batch job; its row goes
  queued/running -> succeeded on its own, its ranks' lines arrive tagged with their compute node
  (n1/0 ... n2/3) and its loss curve gains every step, the same steps ``higgsfield metrics`` prints;
- a run that waits for nodes shows Slurm's reason (Resources, Priority), in the table and on the
  login node's card; the node view is Slurm's (sinfo: state, load, memory, GPUs; the run holding
  each node);
- kill from the page (scancel) ends a pending run and a running one, leaving nothing in squeue and
  no process of either behind; no secret reaches the page.

    .venv/bin/python -m pytest tests/slurm/test_slurm_ui.py -s
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
from slurm_helpers import SECRET, SharedProject, User, make_project, print_timings, squeue_names

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS / "ui"), str(TESTS / "runs")]   # the dashboard's helpers (tests/ has no packages)

pytest.importorskip("starlette")
pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402
from runs_helpers import run_processes  # noqa: E402
from ui_helpers import Dashboard, dashboard, launch_browser, open_page, row, start_from_form, wait_for  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.sshd, pytest.mark.timeout(900)]
STEPS = 12


@pytest.fixture(scope="module")
def project(slurm_project: SharedProject, login: Any,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[User, Path]]:
    """The cluster project, set up (login host key pinned) and deployed (release + environment in the workdir):
    the journey's, put back as made (its runs stay in the workdir: this module's are all named ``ui-*``), or
    one of this module's own. None of its jobs outlives the module."""
    if slurm_project.reuse():
        try:
            yield slurm_project.user, slurm_project.workdir
        finally:
            subprocess.run(["scancel", "-u", login["host"].user], capture_output=True, timeout=60)
            print_timings("ui", slurm_project.user)
        return
    with make_project(login, tmp_path_factory.mktemp("slurm-ui"), "ui") as (user, workdir):
        user("setup", "--accept-new-host-keys", timeout=600, timed="setup")
        user("deploy", timeout=900, timed="deploy")
        yield user, workdir


@pytest.fixture(scope="module")
def ui(project: tuple[User, Path]) -> Iterator[Dashboard]:
    user, _ = project
    with dashboard(user.cwd, env=user.env) as d:
        yield d


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launch_browser() as b:
        yield b


@pytest.fixture(scope="module")
def page(browser: Any, ui: Dashboard) -> Iterator[Any]:
    p = open_page(browser, ui, "#runs")
    yield p
    p.close()


def run_dir(workdir: Path, run: str) -> Path:
    return workdir / "runs" / "lab" / run


def test_a_run_from_the_form_is_a_slurm_job_with_live_logs_and_curves(page: Any, project: tuple[User, Path],
                                                                      ui: Dashboard) -> None:
    user, _ = project
    expect(page.locator("#where")).to_have_text("Slurm partition debug through login")
    t0 = time.monotonic()
    run = start_from_form(page, "probe", {"steps": str(STEPS), "step_s": "0.4", "run_name": "ui-first"})
    assert run == "ui-first"
    expect(page.locator("#toast")).to_contain_text("started ui-first as Slurm job")
    expect(page.locator("#run-state")).to_have_text(re.compile("queued|starting|running"), timeout=30000)
    counts: list[int] = []
    deadline = time.monotonic() + 180
    while page.locator("#run-state").text_content() != "succeeded":
        assert time.monotonic() < deadline, page.locator("#run-state").text_content()
        n = int(page.locator("#points").get_attribute("data-points") or 0)
        if not counts or n != counts[-1]:
            counts.append(n)
        time.sleep(0.1)
    user.timings["form -> succeeded on the page"] = round(time.monotonic() - t0, 1)
    assert len([n for n in counts if 0 < n < STEPS]) >= 2, f"the curve grows while it trains: {counts}"
    expect(page.locator("#points")).to_have_attribute("data-points", str(STEPS), timeout=15000)

    # every rank's lines, tagged with the compute node it ran on (2 nodes x 2 ranks), as 'logs' tags them
    def every_rank() -> set[str] | None:
        shown = page.evaluate("[...document.querySelectorAll('#log .line .who')].map(e => e.textContent)")
        tags = {w for w in shown if re.fullmatch(r"n\d/\d", w)}
        return tags if {w.split("/")[1] for w in tags} == {"0", "1", "2", "3"} else None

    who = wait_for(every_rank, 20, "every rank's lines on the page")
    assert len({w.split("/")[0] for w in who}) == 2, who
    logs = user("logs", "ui-first").stdout
    for w in who:
        assert f"{w} | " in logs, (w, logs[-2000:])

    # the curve is what 'higgsfield metrics' prints, read through the same backend
    steps = [json.loads(ln) for ln in user("metrics", "ui-first", "--json").stdout.splitlines()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert abs(steps[-1]["loss"] - 10.0 / STEPS) < 1e-9
    label = page.locator("#points").text_content() or ""
    assert f"last: step {STEPS}, loss {10.0 / STEPS:.4f}" in label, label
    st = user.status()["ui-first"]
    assert st["state"] == "succeeded" and st["params"]["steps"] == STEPS, st


def test_a_queued_run_shows_slurms_reason_and_kill_from_the_page_ends_both(page: Any, project: tuple[User, Path],
                                                                           ui: Dashboard) -> None:
    user, workdir = project
    page.evaluate("location.hash = '#runs'")
    user("run", "probe", "-p", "gate=never", "--run-name", "ui-long", "--detach")
    expect(row(page, "ui-long").locator(".state")).to_have_text("running", timeout=90000)
    user("run", "probe", "-p", "gate=never", "--run-name", "ui-wait", "--detach")
    wait_row = row(page, "ui-wait")
    expect(wait_row.locator(".state")).to_have_text("queued", timeout=30000)
    expect(wait_row.locator(".queue")).to_have_text(re.compile(r"^waiting: (Resources|Priority)$"), timeout=30000)

    # the node view is Slurm's: the login node with the pending job, the compute nodes with their holder
    page.evaluate("location.hash = '#nodes'")
    login_card = page.locator('.node[data-node="login"]')
    expect(login_card.locator(".node-state")).to_have_text("up", timeout=15000)
    expect(login_card.locator(".waiter")).to_contain_text(re.compile(r"ui-wait waits for an allocation "
                                                                     r"\((Resources|Priority)\)"))
    held = page.locator(".node .holder", has_text="ui-long holds the node")
    expect(held).to_have_count(2, timeout=15000)
    for name in ("n1", "n2", "n3"):
        card = page.locator(f'.node[data-node="{name}"]')
        expect(card.locator(".node-state")).to_have_text(re.compile(r"^(idle|mixed|allocated)"), timeout=15000)
        expect(card).to_contain_text("partition debug")
        expect(card).to_contain_text("Slurm: no GPUs in its gres")
        expect(card).to_contain_text(re.compile(r"of \d+ cores"))   # slurmd's load over its CPU count
    page.evaluate("location.hash = '#runs'")

    # kill the pending one, then the running one, from the page
    t0 = time.monotonic()
    wait_row.locator(".kill").click()
    expect(wait_row.locator(".state")).to_have_text("killed", timeout=30000)
    long_row = row(page, "ui-long")
    wait_for(lambda: run_processes(run_dir(workdir, "ui-long")), 30, "the running job's ranks")
    long_row.locator(".kill").click()
    expect(long_row.locator(".state")).to_have_text("killed", timeout=60000)
    user.timings["kill pending + running from the page"] = round(time.monotonic() - t0, 1)
    assert squeue_names() == []
    wait_for(lambda: not run_processes(run_dir(workdir, "ui-long")) and not run_processes(run_dir(workdir, "ui-wait")),
             30, "no process of either run left")
    runs = user.status()
    assert (runs["ui-long"]["state"], runs["ui-wait"]["state"]) == ("killed", "killed"), runs
    assert SECRET not in page.content()

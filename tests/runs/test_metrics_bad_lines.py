"""Metrics lines of the wrong shape are skipped and counted, never a traceback (issue 22, item 4).

A real ``metrics.jsonl`` holds good steps between every bad shape a worker, a disk or
another tool can leave: not JSON, not an object, wrong kinds (a string ``lr``, a list
for a number, a bool for a number), NaN or infinity where only a finite number makes
sense, a step below 0 or past 2**53, an integer too big for a float, deep brackets and
a line of several MiB. Both readers are run as a user runs them, in subprocesses: the
node's ``higgsfield invoker metrics`` on a local state dir, and ``higgsfield metrics``
of a project whose node is ``localhost`` (the same invoker, through the local transport).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from higgsfield.metrics import METRICS_FILE, Skipped, StepMetrics, decode_line, decode_lines
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import RunDir, RunRecord

pytestmark = pytest.mark.timeout(120)

PROJECT = "badmetrics"
RUN = "bad-1"


def good(step: int) -> str:
    return StepMetrics(step=step, loss=3.0 / step, tokens_per_s=100.0 * step, step_time_s=0.1, lr=1e-3,
                       time=1000.0 + step).to_json()


def step_with(**values: object) -> str:
    d = json.loads(good(1))
    d.update(values)
    return json.dumps(d)


BAD = [
    "not json at all",
    "[1, 2, 3]",
    '"a string"',
    "42",
    "null",
    '{"step": 1, "loss": 3.0, "tok',                        # torn (then a newline came: a line of its own)
    step_with(lr="3e-4"),                                  # lr as a string
    step_with(lr=[0.1]),                                   # a list where a number goes
    step_with(loss={"value": 1.0}),                        # a dict where a number goes
    step_with(tokens_per_s=True),                          # a bool is not a number
    step_with(step=True),
    step_with(step=-1),                                    # out of range
    step_with(step=2**53 + 1),
    step_with(step=2.5),
    step_with(step="7"),
    step_with(loss=10**400),                               # an integer no float holds
    step_with(tokens_per_s=None),                          # a required figure missing
    step_with(step_time_s=-0.5),
    '{"loss": 1.0, "tokens_per_s": 1.0, "step_time_s": 1.0}',   # no step
    good(1).replace('"lr":0.001', '"lr":NaN'),              # NaN where only a finite number makes sense
    good(1).replace('"lr":0.001', '"lr":Infinity'),
    good(1).replace('"step_time_s":0.1', '"step_time_s":-Infinity'),
    "[" * 100_000,                                          # deep brackets, past the line cap
    '{"a":' * 20_000,                                       # deep, under the cap: json's recursion gives up
    '{"step": 1, "loss": 1, "tokens_per_s": 1, "step_time_s": 1, "pad": "' + "x" * (3 << 20) + '"}',  # 3 MiB
    "\x00\x01\x1b[31m garbage",
]
GOOD_STEPS = [1, 2, 3]


def write_file(path: Path) -> None:
    """Good steps 1..3 with every bad shape around them (and blank lines, which are not counted)."""
    lines = [good(1), *BAD[:10], "", good(2), *BAD[10:], "   ", good(3)]
    with open(path, "wb") as f:
        f.write(("\n".join(lines) + "\n").encode())
        f.write(b"\xff\xfe not utf-8\n")


N_BAD = len(BAD) + 1


def test_each_shape_is_refused_and_counted_by_the_library() -> None:
    for line in BAD:
        with pytest.raises(ValueError):
            decode_line(line)
    steps, skipped = decode_lines([good(1), *BAD, good(2)])
    assert [m.step for m in steps] == [1, 2] and skipped == len(BAD)
    # what stays a step: a diverged loss (null or NaN), an integral float step, a newer writer's keys
    assert decode_line(step_with(loss=None)).loss != decode_line(step_with(loss=None)).loss   # NaN
    assert decode_line(good(1).replace('"loss":3.0', '"loss":NaN')).step == 1
    assert decode_line(step_with(step=4.0)).step == 4
    assert decode_line(step_with(step=2**53)).step == 2**53
    assert decode_line(step_with(extra=[1, {"x": 2}])).step == 1
    assert str(Skipped(3)) == "3 lines skipped (not a metrics record)"


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    """A project whose one node is ``localhost`` and a finished run there whose metrics file is full of bad lines."""
    state = tmp_path / "state"
    proj = tmp_path / PROJECT
    (proj / "src").mkdir(parents=True)
    (proj / "higgsfield.yml").write_text(f"name: {PROJECT}\nnodes:\n  - host: localhost\nnproc_per_node: 1\n"
                                         f"runtime: process\nstate_dir: {state}\n")
    rd = RunDir(NodeState(state), PROJECT, RUN)
    rd.make()
    rd.write(RunRecord(project=PROJECT, experiment="train", run=RUN, node="localhost", node_rank=0, nnodes=1,
                       nproc=1, state="succeeded", exit_code=0, started_at=1000.0, ended_at=1010.0))
    write_file(rd.path / METRICS_FILE)
    return proj


def hf(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=90)


def no_traceback(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr + r.stdout and "internal error" not in r.stderr.lower(), r.stderr


def test_the_node_verb_prints_the_good_steps_and_the_count(project: Path, tmp_path: Path) -> None:
    r = hf("invoker", "--state-dir", str(tmp_path / "state"), "metrics", "--project", PROJECT, "--run", RUN,
           cwd=tmp_path)
    no_traceback(r)
    lines = r.stdout.splitlines()
    assert [json.loads(x)["step"] for x in lines[:-1]] == GOOD_STEPS
    assert lines[-1] == f"#skipped {N_BAD}"
    # --skip counts good lines only; the file's count is the same
    r = hf("invoker", "--state-dir", str(tmp_path / "state"), "metrics", "--project", PROJECT, "--run", RUN,
           "--skip", "2", cwd=tmp_path)
    no_traceback(r)
    assert [json.loads(x)["step"] for x in r.stdout.splitlines()[:-1]] == [3]
    assert r.stdout.splitlines()[-1] == f"#skipped {N_BAD}"


def test_the_laptop_command_prints_the_steps_and_says_how_many_were_skipped(project: Path) -> None:
    r = hf("metrics", RUN, cwd=project)
    no_traceback(r)
    rows = r.stdout.splitlines()
    assert rows[0].split()[:3] == ["STEP", "LOSS", "TOKENS/S"]
    assert [int(x.split()[0]) for x in rows[1:]] == GOOD_STEPS
    assert f"{N_BAD} lines skipped (not a metrics record)" in r.stderr
    r = hf("metrics", RUN, "--json", cwd=project)
    no_traceback(r)
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert [d["step"] for d in out[:-1]] == GOOD_STEPS
    assert out[-1] == {"skipped": N_BAD}


def test_a_clean_file_has_no_skipped_line(project: Path, tmp_path: Path) -> None:
    path = RunDir(NodeState(tmp_path / "state"), PROJECT, RUN).path / METRICS_FILE
    path.write_text(good(1) + "\n" + good(2) + "\n")
    r = hf("metrics", RUN, "--json", cwd=project)
    no_traceback(r)
    assert [json.loads(x)["step"] for x in r.stdout.splitlines()] == [1, 2]
    assert "skipped" not in r.stderr


def test_a_symlinked_or_fifo_metrics_file_is_not_read(project: Path, tmp_path: Path) -> None:
    import os

    path = RunDir(NodeState(tmp_path / "state"), PROJECT, RUN).path / METRICS_FILE
    outside = tmp_path / "outside.jsonl"
    outside.write_text(good(9) + "\n")
    path.unlink()
    path.symlink_to(outside)
    r = hf("invoker", "--state-dir", str(tmp_path / "state"), "metrics", "--project", PROJECT, "--run", RUN,
           cwd=tmp_path)
    no_traceback(r)
    assert r.stdout == ""
    path.unlink()
    os.mkfifo(path)
    r = hf("invoker", "--state-dir", str(tmp_path / "state"), "metrics", "--project", PROJECT, "--run", RUN,
           cwd=tmp_path)
    no_traceback(r)
    assert r.stdout == ""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_dashboard_plots_the_good_steps_and_shows_the_count(project: Path) -> None:
    """The run's page: three points on the curves and, small beside their title, how many lines were skipped."""
    pytest.importorskip("starlette")
    pytest.importorskip("playwright")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ui"))
    from playwright.sync_api import expect
    from ui_helpers import dashboard, launch_browser, open_page

    with dashboard(project) as d, launch_browser() as browser:
        page = open_page(browser, d, f"#run/{RUN}")
        expect(page.locator("#points")).to_have_attribute("data-points", "3", timeout=30000)
        skipped = page.locator("#skipped")
        expect(skipped).to_have_attribute("data-skipped", str(N_BAD), timeout=30000)
        expect(skipped).to_have_text(f"{N_BAD} lines skipped (not a metrics record)")
        assert skipped.is_visible()
        page.close()
    assert not any("Traceback" in line for line in d.stderr), "".join(d.stderr)[-2000:]

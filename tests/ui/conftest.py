"""Fixtures of the dashboard's browser tests: Debian's Chromium through Playwright, and a real ``higgsfield ui``.

- ``browser``: headless Chromium (``/usr/lib/chromium/chromium``, installed by the
  test bed's apt step or ``make chromium``; never ``playwright install``), one per module.
- ``ui_bed`` / ``ui_cluster``: the test bed with the dashboard's own hosts hfnode15..17, and
  the project ``hfui`` on them (``make_cluster`` of tests/runs, deployed once).
- :func:`start_dashboard`: ``higgsfield ui --port 0 --no-browser`` in a project, as a
  user starts it (a subprocess; the URL read from its stdout), stopped with SIGINT.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
RUNS = HERE.parent / "runs"
sys.path.insert(0, str(RUNS))  # runs_helpers (tests/ has no packages), as tests/faults does

from runs_helpers import bed_for, runs_conftest  # noqa: E402
from runs_helpers import restore_hosts as _restore_hosts  # noqa: E402
from ui_helpers import INDICES, launch_browser  # noqa: E402


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for one test module (ui_helpers.launch_browser says why not longer)."""
    with launch_browser() as b:
        yield b


# -- the test bed: three hosts of the dashboard's own ---------------------------------------------

TICKER = '''\
"""Prints 'tick UNIX-TIME' every ``every`` seconds on every rank (the page's log latency) and writes a step's
metrics each time (the loss curve); with ``gate`` it runs until RUN_DIR/<gate> exists; ``fail_rank`` fails
that rank at step 3."""
import os
import time
from pathlib import Path

from higgsfield.experiment import experiment, param


@experiment("ticker")
@param("steps", default=20)
@param("every", default=0.25)
@param("gate", default="")
@param("fail_rank", default=-1)
def ticker(params):
    from higgsfield.training import StepTimer

    timer = StepTimer()
    gate = Path(os.environ["HIGGSFIELD_RUN_DIR"]) / params.gate if params.gate else None
    step = 0
    while (not gate.exists()) if gate is not None else step < params.steps:
        step += 1
        if params.rank == params.fail_rank and step == 3:
            raise RuntimeError(f"ticker failure on rank {params.rank}")
        print(f"tick {time.time():.3f} rank {params.rank} step {step}", flush=True)
        timer.step(step, 10.0 / step, 128)
        time.sleep(params.every)
'''


def _runs_conftest() -> Any:
    return runs_conftest()


def restore_hosts(tb: Any) -> None:
    _restore_hosts(tb, INDICES)


@pytest.fixture(scope="session")
def ui_bed() -> Any:
    return bed_for(INDICES)


@pytest.fixture(scope="session")
def ui_cluster(ui_bed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The project ``hfui`` on hfnode15..17 (tests/runs' make_cluster: Docker runtime, the invoker linked),
    with src/ticker.py, deployed once."""
    import subprocess

    c = _runs_conftest().make_cluster(ui_bed, tmp_path_factory.mktemp("ui") / "hfui", INDICES)
    (c.dir / "src" / "ticker.py").write_text(TICKER)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "add", "-A"], cwd=c.dir, check=True, env=env)
    subprocess.run(["git", "commit", "-qm", "ticker"], cwd=c.dir, check=True, env=env)
    c.hf("deploy", check=True, timeout=900)
    yield c
    restore_hosts(ui_bed)

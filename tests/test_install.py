"""The install lines of the README work as written: the wheel and the sdist, each in a fresh venv.

`pip install higgsfield` from PyPI would get an unrelated project of the same name, so
users install from a checkout or the repository URL; both build the same two artifacts.
Each is built from the checkout's files alone (copied out, so nothing of the checkout is
importable), installed with torch into a venv of its own, and then a new user's first
two commands run there: `higgsfield init demo` and, in the project, `higgsfield run
example` on its one `localhost` node. The install reaches only this machine's pip
configuration (torch's CPU wheel is cached here), about 20 s a venv (--no-compile: byte-compiling
torch alone would double that).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The wheel and the sdist, built (PEP 517, setuptools) from a copy of the tracked files."""
    src, dist = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],  # noqa: S607
                            cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        if (REPO / rel).is_file():   # the working tree as it is (a file deleted there is not shipped)
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    for hook in ("build_wheel", "build_sdist"):   # each in a process of its own, as a build frontend calls them
        code = f"from setuptools import build_meta as b; import sys; b.{hook}(sys.argv[1])"
        subprocess.run([sys.executable, "-c", code, str(dist)], cwd=src, capture_output=True, check=True, timeout=300)
    wheel, sdist = sorted(dist.glob("higgsfield-*.whl")), sorted(dist.glob("higgsfield-*.tar.gz"))
    assert len(wheel) == 1 and len(sdist) == 1, list(dist.iterdir())
    return {"wheel": wheel[0], "sdist": sdist[0]}


def _env(home: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "PIP_CONFIG_FILE", "PIP_CACHE_DIR")}
    return {**keep, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "PYTHONNOUSERSITE": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "NO_COLOR": "1"}


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_a_fresh_venv_installs_the_artifact_then_init_and_run_example_work(
        artifacts: dict[str, Path], tmp_path: Path, kind: str) -> None:
    venv, home, work = tmp_path / "venv", tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = _env(home)
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-compile", "torch==2.13.0",
                          str(artifacts[kind])],
                         cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr[-3000:]

    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import higgsfield; print(higgsfield.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    assert where.startswith(str(venv)) and str(REPO) not in where, where

    init = subprocess.run([str(venv / "bin" / "higgsfield"), "init", "demo"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert init.returncode == 0, init.stderr
    assert "Created project 'demo' in ./demo" in init.stdout

    run = subprocess.run([str(venv / "bin" / "higgsfield"), "run", "example", "-p", "steps=30"],
                         cwd=work / "demo", env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    losses = [float(line.split()[-1]) for line in run.stdout.splitlines() if "| step" in line]
    assert len(losses) == 4 and losses[-1] < losses[0], run.stdout
    assert "succeeded" in run.stderr, run.stderr

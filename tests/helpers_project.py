"""Shared helpers for the project/config/discovery tests: run the real CLI, write files.

The CLI runs as ``python -m higgsfield`` in a subprocess (exactly what a user gets:
exit code, stderr, no traceback) with ``HIGGSFIELD_HOME_CONFIG`` pointed at a
temporary directory so no test touches the real ``~/.config``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

MINIMAL_CONFIG = """\
name: demo
nodes:
  - host: gpu-1.example.com
"""


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIGGSFIELD_")}
    env["HIGGSFIELD_HOME_CONFIG"] = str(home)
    env.update(extra)
    return env


def run_cli(cwd: Path, *args: str, home: Path | None = None, timeout: float = 60,
            python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    """``python -m higgsfield ARGS`` in ``cwd``; never raises on a non-zero exit."""
    home = home if home is not None else cwd / ".test-home"
    return subprocess.run([python, "-m", "higgsfield", *args], cwd=cwd, env=cli_env(home),
                          capture_output=True, text=True, timeout=timeout, check=False)


def write(path: Path, text: str) -> Path:
    """Write dedented ``text`` to ``path`` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def assert_one_line_error(proc: subprocess.CompletedProcess[str], message: str, code: int = 2) -> None:
    """The CLI failed with ``code`` and printed exactly ``error: message``: one line, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert proc.stderr == f"error: {message}\n", proc.stderr


# -- experiment sources shared by the discovery and runtime tests --------------

BODY = """\
def train(params):
    return params
"""

# Each source declares experiment "e" with params size (options) and lr.
IMPORT_STYLES = {
    "from-import": """\
        from higgsfield.experiment import experiment, param

        @experiment("e", seed=1)
        @param("size", default="7b", options=["7b", "13b"])
        @param("lr", default=0.1)
        """,
    "from-import-aliased": """\
        from higgsfield.experiment import experiment as exp, param as p

        @exp("e", seed=1)
        @p("size", default="7b", options=["7b", "13b"])
        @p("lr", default=0.1)
        """,
    "import-as": """\
        import higgsfield.experiment as hx

        @hx.experiment("e", seed=1)
        @hx.param("size", default="7b", options=["7b", "13b"])
        @hx.param("lr", default=0.1)
        """,
    "import-module": """\
        import higgsfield.experiment

        @higgsfield.experiment.experiment("e", seed=1)
        @higgsfield.experiment.param("size", default="7b", options=["7b", "13b"])
        @higgsfield.experiment.param("lr", default=0.1)
        """,
    "from-package-import-module": """\
        from higgsfield import experiment as hexp

        @hexp.experiment("e", seed=1)
        @hexp.param("size", default="7b", options=["7b", "13b"])
        @hexp.param("lr", default=0.1)
        """,
    "experiment-last": """\
        from higgsfield.experiment import experiment, param

        @param("size", default="7b", options=["7b", "13b"])
        @param("lr", default=0.1)
        @experiment("e", seed=1)
        """,
    "experiment-between": """\
        from higgsfield.experiment import experiment, param

        @param("size", default="7b", options=["7b", "13b"])
        @experiment("e", seed=1)
        @param("lr", default=0.1)
        """,
    "keywords-and-types": """\
        from higgsfield.experiment import experiment, param

        @experiment(name="e", seed=1)
        @param(name="size", type=str, default="7b", options=["7b", "13b"])
        @param("lr", 0.1)
        """,
    "mixed-with-other-decorators": """\
        import functools
        import higgsfield.experiment as hx

        @functools.lru_cache
        @hx.param("size", default="7b", options=["7b", "13b"])
        @hx.experiment("e", seed=1)
        @hx.param("lr", default=0.1)
        """,
}


IMPORT_STYLES = {k: textwrap.dedent(v) for k, v in IMPORT_STYLES.items()}


def local_project(base: Path, name: str, sources: dict[str, str], *, nproc: int = 1, extra: str = "") -> Path:
    """A project on ``localhost`` (process runtime, its state dir under ``base``): ``base/proj``.

    ``sources`` maps a file name under ``src/`` to its text; ``extra`` is appended to
    ``higgsfield.yml`` (``secrets:``, ``retention:`` ...).
    """
    proj = base / "proj"
    (proj / "src").mkdir(parents=True)
    for file, text in sources.items():
        (proj / "src" / file).write_text(text)
    (proj / "higgsfield.yml").write_text(
        f"name: {name}\nnodes:\n  - host: localhost\nnproc_per_node: {nproc}\nruntime: process\n"
        f"state_dir: {base / 'state'}\n{extra}")
    return proj

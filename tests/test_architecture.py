"""The import contracts of docs/architecture.md hold, and they catch a new violation.

The contracts live in ``.importlinter`` at the repository root (import-linter,
which reads the static import graph: an import inside a function counts as much
as one at the top). The first test checks this checkout. The others plant one
violation at a time in a copy of the package and expect its contract to break,
so no contract can pass by matching nothing.
The run-time side of "no torch on the control side" is the ``sys.modules``
probe of ``higgsfield --help`` in tests/control/test_cli_project.py.
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / ".importlinter"

#: One line per contract: relative file -> code appended to it, that breaks exactly that contract.
PLANTED = {
    "layers": ("higgsfield/control/remote/base.py", "def _planted() -> None:\n    from higgsfield.control import backends\n"),
    "cli-on-top": ("higgsfield/control/ui/app.py", "def _planted() -> None:\n    import higgsfield.control.cli\n"),
    "ui-on-top": ("higgsfield/node/observe/stats.py", "def _planted() -> None:\n    import starlette\n"),
    "ui-through-the-seam": ("higgsfield/control/ui/app.py",
                            "def _planted() -> None:\n    from higgsfield.control.backends.nodes import status\n"),
    "node-side": ("higgsfield/node/observe/stats.py",
                  "def _planted() -> None:\n    from higgsfield.control.remote import base\n"),
    "training-library": ("higgsfield/training.py",
                         "def _planted() -> None:\n    from higgsfield.control.remote import base\n"),
    "no-torch-on-the-control-side": ("higgsfield/control/config/schema.py", "def _planted() -> None:\n    import torch\n"),
    "control-side-apart-from-node-side": ("higgsfield/control/doctor/checks.py",
                                          "def _planted() -> None:\n    from higgsfield.node.gang import queue\n"),
    "contract-stdlib-only": ("higgsfield/contract/runspec.py", "def _planted() -> None:\n    import yaml\n"),
    "acyclic": ("higgsfield/training.py",  # llama imports training: a circle
                "def _planted() -> None:\n    from higgsfield import llama\n"),
}


def _contract_names() -> dict[str, str]:
    parser = configparser.ConfigParser()
    parser.read(CONFIG)
    prefix = "importlinter:contract:"
    return {s.removeprefix(prefix): parser[s]["name"] for s in parser.sections() if s.startswith(prefix)}


def _lint(cwd: Path) -> tuple[int, str]:
    """``lint-imports`` over the package found first on the path from ``cwd``: (exit code, report)."""
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    env = {**os.environ, "PYTHONPATH": str(cwd), "COLUMNS": "1000", "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-c", code, str(CONFIG), "--no-cache", "--no-logo"],  # noqa: S603
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _verdicts(report: str) -> dict[str, str]:
    """contract name -> KEPT / BROKEN, from the report's summary lines."""
    found = re.findall(r"^(.*?) (KEPT|BROKEN)(?: \(\d+ ignored imports?\))?$", report, re.MULTILINE)
    return dict(found)


@pytest.mark.timeout(180)
def test_import_contracts_hold() -> None:
    rc, report = _lint(ROOT)
    names = _contract_names()
    assert _verdicts(report) == {name: "KEPT" for name in names.values()}, report
    assert rc == 0, (
        "an import runs against the layers of docs/architecture.md: move the code to the layer it "
        "belongs to (an ignore_imports entry that no longer matches must be deleted)\n" + report)


def test_a_violation_is_planted_for_every_contract() -> None:
    assert set(PLANTED) == set(_contract_names()), "plant one violation for each contract in .importlinter"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("contract", sorted(PLANTED))
def test_the_contract_catches_a_new_violation(tmp_path: Path, contract: str) -> None:
    shutil.copytree(ROOT / "higgsfield", tmp_path / "higgsfield", ignore=shutil.ignore_patterns("__pycache__"))
    rel, code = PLANTED[contract]
    with (tmp_path / rel).open("a") as f:
        f.write("\n\n" + code)
    rc, report = _lint(tmp_path)
    assert rc != 0, report
    assert _verdicts(report).get(_contract_names()[contract]) == "BROKEN", report

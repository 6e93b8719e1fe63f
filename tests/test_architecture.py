"""The import contracts of docs/architecture.md hold, and they catch a new violation.

The contracts live in ``.importlinter`` at the repository root (import-linter,
which reads the static import graph: an import inside a function counts as much
as one at the top). The first test checks this checkout. The others plant one
violation at a time in a copy of the package and expect its contract to break,
so no contract can pass by matching nothing.
The run-time side of "no torch on the control side" is the ``sys.modules``
probe of ``higgsfield --help`` in tests/control/test_cli_project.py.

The error tree of ``higgsfield.contract.errors`` is checked the same way: every
exception class defined in higgsfield is a ``HiggsfieldError`` or on the
internal list below, and each is named in that module's docstring (a class
defined elsewhere, on the same line as its module); a planted stray breaks it.
"""

from __future__ import annotations

import configparser
import json
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


# -- the error tree ------------------------------------------------------------------------------

#: Exception classes that never reach a user, so they stay outside the tree (errors.py says why for each).
INTERNAL_EXCEPTIONS = {
    "higgsfield.contract.decode.DecodeError",
    "higgsfield.contract.slurmjob.WrongVersion",
    "higgsfield.contract.values.WrongValue",
    "higgsfield.node.gang.wire.WireError",
    "higgsfield.control.config.schema.NodeDup",
    "higgsfield.control.config.fields.Misplaced",
    "higgsfield.control.ui.app.BadBody",
    "higgsfield.control.backends.nodes.fleet._Down",
    "higgsfield.control.cli._ClosedPipe",
}

#: Run in a fresh interpreter over the package found first from its cwd: imports every module of it and
#: prints, as JSON, every exception class defined in it (module, qualified name, in the tree?), the
#: modules that could not be imported (a training extra not installed), and errors.py's docstring.
_EXCEPTIONS_SCRIPT = r"""
import importlib, importlib.util, json, pkgutil, sys
import higgsfield
from higgsfield.contract import errors
OPTIONAL = {"torch", "deepspeed", "transformers", "tokenizers", "datasets", "safetensors", "accelerate"}
skipped, broken = [], []
for info in pkgutil.walk_packages(higgsfield.__path__, "higgsfield."):
    if info.name.endswith(".__main__"):      # runs the CLI when imported
        continue
    try:
        importlib.import_module(info.name)
    except ModuleNotFoundError as e:
        root = (e.name or "").split(".")[0]
        if root in OPTIONAL and importlib.util.find_spec(root) is None:
            skipped.append(f"{info.name} ({root} is not installed)")
        else:
            broken.append(f"{info.name}: {e!r}")
def every(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from every(sub)
found = sorted({(c.__module__, c.__qualname__, issubclass(c, errors.HiggsfieldError))
                for c in every(BaseException) if c.__module__.split(".")[0] == "higgsfield"})
print(json.dumps({"found": found, "skipped": skipped, "broken": broken, "doc": errors.__doc__}))
"""


def _exceptions(cwd: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    proc = subprocess.run([sys.executable, "-c", _EXCEPTIONS_SCRIPT], cwd=cwd, env=env,  # noqa: S603
                          capture_output=True, text=True, timeout=150, check=False)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return out


def _tree_problems(cwd: Path) -> list[str]:
    """What is wrong with the error tree of the package at ``cwd``: one line per problem."""
    got = _exceptions(cwd)
    problems = [f"cannot import {b}" for b in got["broken"]]  # type: ignore[attr-defined]
    doc_lines = str(got["doc"]).splitlines()
    found = got["found"]
    for module, name, in_tree in found:  # type: ignore[attr-defined]
        full = f"{module}.{name}"
        if not in_tree and full not in INTERNAL_EXCEPTIONS:
            problems.append(f"{full} is no HiggsfieldError: subclass the right class of "
                            "higgsfield.contract.errors (or, if it never reaches a user, list it as internal)")
        short = module.removeprefix("higgsfield.")
        lines = [ln for ln in doc_lines if re.search(rf"(?<![\w.]){re.escape(name)}\b", ln)]
        if not lines:
            problems.append(f"{full} is not named in higgsfield.contract.errors's docstring")
        elif module != "higgsfield.contract.errors" and not any(f"({short})" in ln for ln in lines):
            problems.append(f"{full}: errors.py's docstring names it without its module '({short})'")
    listed = {f"{m}.{n}" for m, n, _ in found}  # type: ignore[attr-defined]
    problems += [f"{gone} is on INTERNAL_EXCEPTIONS but defined nowhere" for gone in INTERNAL_EXCEPTIONS - listed]
    return problems


@pytest.mark.timeout(180)
def test_every_exception_is_in_the_error_tree_and_documented() -> None:
    assert _tree_problems(ROOT) == []


#: Each plant: relative file -> code appended to it, and the problem it must cause.
PLANTED_EXCEPTIONS = {
    "stray": ("higgsfield/control/backends/pick.py", "class PlantedStray(ValueError):\n    pass\n",
              "higgsfield.control.backends.pick.PlantedStray is no HiggsfieldError"),
    "undocumented": ("higgsfield/node/gang/queue.py",
                     "from higgsfield.contract.errors import RunError as _RunError\n\n\n"
                     "class PlantedUndocumented(_RunError):\n    pass\n",
                     "higgsfield.node.gang.queue.PlantedUndocumented is not named"),
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("plant", sorted(PLANTED_EXCEPTIONS))
def test_the_error_tree_check_catches_a_planted_class(tmp_path: Path, plant: str) -> None:
    shutil.copytree(ROOT / "higgsfield", tmp_path / "higgsfield", ignore=shutil.ignore_patterns("__pycache__"))
    rel, code, problem = PLANTED_EXCEPTIONS[plant]
    with (tmp_path / rel).open("a") as f:
        f.write("\n\n" + code)
    problems = _tree_problems(tmp_path)
    assert any(p.startswith(problem) for p in problems), problems

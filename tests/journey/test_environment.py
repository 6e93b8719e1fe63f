"""The project environment of runtime: process (higgsfield.node.code.environment, .env_key, .env_build), on this machine.

Fast: what counts as listing torch, the key, which python a run gets. Slow: a real
build with pip (torch from this machine's wheel on disk), skipped when unchanged,
rebuilt beside the old one when requirements.txt changes, and the env's ``higgsfield``
is the invoker's own package.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from higgsfield.contract.errors import RunError
from higgsfield.node.code import env_build
from higgsfield.node.code import env_key as keymod
from higgsfield.node.code import environment as envmod
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import write_json

TORCH = "torch==2.13.0"  # the CPU wheel this machine's pip has on disk (TESTBED.md)


@pytest.mark.parametrize(("text", "listed"), [
    ("torch==2.13.0\n", True),
    ("numpy\nTorch >= 2.6 ; python_version >= '3.10'\n", True),
    ("torch @ https://example.invalid/torch-2.6-cp311.whl\n", True),
    ("  torch  # pinned by the base image\n", True),
    ("torchvision==0.20\n", False),
    ("# torch==2.13.0\n", False),
    ("--extra-index-url https://download.pytorch.org/whl/cpu\nnumpy\n", False),
    ("-r torch.txt\n", False),
    ("", False),
])
def test_what_counts_as_listing_torch(text: str, listed: bool) -> None:
    assert keymod.lists_torch(text) is listed
    assert keymod.torch_added(text) == (None if listed else keymod.DEFAULT_TORCH)


@pytest.mark.parametrize(("text", "extra"), [
    ("", ["torch", "numpy"]),
    ("torch==2.13.0\n", ["numpy"]),
    ("numpy==2.1.3\ntorch==2.13.0\n", []),
    ("NumPy>=2\n", ["torch"]),
])
def test_deploy_adds_torch_and_numpy_unless_named(text: str, extra: list[str]) -> None:
    """numpy: torch.distributed's object collectives (Checkpoint's layout) need it, torch's wheel lacks it."""
    assert keymod.added(text) == extra


def test_the_key_follows_requirements_and_python() -> None:
    a = keymod.env_key("numpy==2.1\n", (3, 11))
    assert a == keymod.env_key("numpy==2.1\n", (3, 11))
    assert a.endswith("-py311") and len(a.split("-")[0]) == 12
    assert keymod.env_key("numpy==2.2\n", (3, 11)) != a
    assert keymod.env_key("numpy==2.1\n", (3, 12)) != a
    # naming torch changes what is built, so it changes the key
    assert keymod.env_key("numpy==2.1\ntorch\n", (3, 11)) != a


def _code(tmp_path: Path, requirements: str) -> Path:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "requirements.txt").write_text(requirements)
    return code


def test_a_run_without_environment_uses_this_python_only_if_it_has_torch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = _code(tmp_path, TORCH + "\n")
    assert envmod.status(NodeState(tmp_path / "state"), "p", code).state == "missing"
    assert envmod.python_for_run(NodeState(tmp_path / "state"), "p", code) == sys.executable  # this venv has torch
    real = envmod.importlib.util.find_spec
    monkeypatch.setattr(envmod.importlib.util, "find_spec", lambda name: None if name == "torch" else real(name))
    with pytest.raises(RunError, match="missing on this node: run 'higgsfield deploy'"):
        envmod.python_for_run(NodeState(tmp_path / "state"), "p", code)


def test_a_stale_environment_is_refused(tmp_path: Path) -> None:
    state, code = NodeState(tmp_path / "state"), _code(tmp_path, "numpy\n")
    old = state.envs("p") / "0123456789ab-py311"
    (old / "bin").mkdir(parents=True)
    (old / "bin" / "python").symlink_to(sys.executable)
    (old / envmod.COMPLETE).write_text("{}\n")
    state.env_record("p").parent.mkdir(parents=True)
    write_json(state.env_record("p"), {"key": old.name, "dir": str(old), "python": str(old / "bin/python")})
    st = envmod.status(state, "p", code)
    assert st.state == "stale" and st.key == old.name and st.wanted != old.name
    with pytest.raises(RunError, match="built for another requirements.txt: run 'higgsfield deploy'"):
        envmod.python_for_run(state, "p", code)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_build_skip_rebuild_and_the_invokers_higgsfield(tmp_path: Path) -> None:
    state, code = NodeState(tmp_path / "state"), _code(tmp_path, TORCH + "\n")
    said: list[str] = []
    first = env_build.build(state, "p", code_dir=code, progress=said.append)
    assert first.built and str(first.torch).startswith("2.13.0") and first.torch_added is None
    assert said[0] == "creating the venv" and said[-1].startswith("ready: torch 2.13.0")
    assert any(s.startswith(("Collecting torch", "Processing")) and "torch" in s for s in said), said
    assert any(s.startswith("Successfully installed") for s in said), said   # shown cut at 160 characters
    installed = [ln for ln in state.env_build_log("p").read_text().splitlines()
                 if ln.startswith("Successfully installed")]
    assert installed and "torch-2.13.0" in installed[-1] and " numpy-" in installed[-1], installed  # numpy: added
    python = str(first.python)
    assert envmod.python_for_run(state, "p", code) == python
    # the env's higgsfield is the invoker's package, ahead of anything the project installs
    out = subprocess.run([python, "-c", "import higgsfield, os, sys; print(os.path.realpath(higgsfield.__file__))"],
                         capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    assert out == str(envmod.invoker_package() / "__init__.py")
    assert "torch==2.13.0" in state.env_build_log("p").read_text()
    # byte-compiled: what a run's start imports (by the import check), not every file of torch
    site = envmod.site_packages(Path(first.dir))
    tag = f"{sys.implementation.cache_tag}.pyc"
    assert (site / "torch" / "__pycache__" / f"__init__.{tag}").is_file()
    assert (site / "torch" / "distributed" / "__pycache__" / f"__init__.{tag}").is_file()
    assert not (site / "torch" / "testing" / "_internal" / "__pycache__" / f"common_utils.{tag}").exists()

    said.clear()
    again = env_build.build(state, "p", code_dir=code, progress=said.append)
    assert not again.built and said == ["unchanged"] and again.key == first.key

    # a changed requirements.txt: a new environment; the old one goes (no run uses it)
    (code / "requirements.txt").write_text(TORCH + "\n# a comment changes the hash\n")
    assert envmod.status(state, "p", code).state == "stale"
    third = env_build.build(state, "p", code_dir=code)
    assert third.built and third.key != first.key and third.pruned == [first.key]
    assert json.loads(state.env_record("p").read_text())["key"] == third.key
    assert envmod.status(state, "p", code).state == "present"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_failing_install_names_the_problem_and_leaves_nothing(tmp_path: Path) -> None:
    state, code = NodeState(tmp_path / "state"), _code(tmp_path, TORCH + "\nno-such-package-hf-journey==0.0.1\n")
    with pytest.raises(RunError, match=r"pip install of the project environment failed: .*no-such-package"):
        env_build.build(state, "p", code_dir=code)
    assert envmod.status(state, "p", code).state == "missing"
    assert [d.name for d in state.envs("p").iterdir() if not d.name.startswith(".")] == []

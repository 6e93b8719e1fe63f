"""The invoker wheel built from this checkout (cached by build id) and the wheelhouse's platform tags."""

from __future__ import annotations

import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

import higgsfield
from higgsfield.contract.errors import StepFailed
from higgsfield.control.provision.invoker import _PROBE, _node_python
from higgsfield.control.provision.wheels import (
    NodePython,
    _platforms,
    build_id,
    build_wheel,
    runtime_requirements,
)


def test_wheel_is_this_build_and_cached(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    assert wheel.name == f"higgsfield-{higgsfield.__version__}-py3-none-any.whl"
    assert wheel.parent.name == build_id() and build_id().startswith(higgsfield.__version__ + "+")
    names = zipfile.ZipFile(wheel).namelist()
    assert "higgsfield/control/remote/ssh.py" in names and any(n.startswith("higgsfield/templates/") for n in names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "higgsfield = higgsfield.control.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()
    start = time.monotonic()
    assert build_wheel(tmp_path) == wheel and time.monotonic() - start < 1  # from the cache


def test_requirements_pinned_and_platform_tags() -> None:
    reqs = runtime_requirements()
    assert any(r.startswith("asyncssh==") for r in reqs) and not any("torch" in r for r in reqs)
    tags = _platforms(NodePython("3.11", "x86_64", "2.36"))
    assert "manylinux_2_17_x86_64" in tags and "manylinux_2_36_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert _platforms(NodePython("3.12", "aarch64", None)) == ["linux_aarch64"]


def test_wheelhouse_requirements_come_from_the_wheel_sent(tmp_path: Path) -> None:
    """The wheel's METADATA decides, not the installed metadata (an editable install's can be older)."""
    wheel = build_wheel(tmp_path)
    reqs = runtime_requirements(wheel)
    names = {r.split("==")[0].split(">=")[0].lower() for r in reqs}
    assert {"click", "pydantic", "asyncssh", "docker", "psutil"} <= names and "torch" not in names
    assert next(r for r in reqs if r.startswith("psutil")).startswith("psutil==")  # pinned to this side's
    # a dependency added after `pip install -e`: listed by the wheel, unknown here, kept as the wheel says
    fake = tmp_path / "higgsfield-9.9-py3-none-any.whl"
    with zipfile.ZipFile(fake, "w") as z:
        z.writestr("higgsfield-9.9.dist-info/METADATA",
                   "Metadata-Version: 2.1\nName: higgsfield\nVersion: 9.9\nRequires-Dist: click>=8.1\n"
                   "Requires-Dist: hf-not-installed-dep>=1.2\nRequires-Dist: torch>=2.6; extra == \"train\"\n")
    got = runtime_requirements(fake)
    assert got[0].startswith("click==") and got[1:] == ["hf-not-installed-dep>=1.2"]


def test_the_nodes_python_probe_is_decoded_once_and_a_bad_answer_is_one_line() -> None:
    """The probe (the invoker step's ``_PROBE``) run by this very Python decodes to its NodePython; an answer
    that does not decode fails the step in one line, never a KeyError."""
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=30)
    py = _node_python(out.stdout)
    assert py.version == f"{sys.version_info[0]}.{sys.version_info[1]}" and py.machine
    assert _node_python('{"version": "3.11", "machine": "x86_64", "glibc": null}') == \
        NodePython("3.11", "x86_64", None)
    for bad, needle in (("not json", "not JSON"), ('{"machine": "x"}', "'version'"),
                        ('{"version": 3.11, "machine": "x", "glibc": null}', "'version' must be a string"),
                        ('{"version": "three", "machine": "x", "glibc": null}', "is not MAJOR.MINOR")):
        with pytest.raises(StepFailed) as e:
            _node_python(bad)
        assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)

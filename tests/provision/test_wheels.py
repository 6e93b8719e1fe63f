"""The invoker wheel built from this checkout (cached by build id) and the wheelhouse's platform tags."""

from __future__ import annotations

import time
import zipfile
from pathlib import Path

import higgsfield
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

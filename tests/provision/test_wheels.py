"""The invoker wheel built from this checkout (cached by build id) and the wheelhouse's platform tags."""

from __future__ import annotations

import time
import zipfile
from pathlib import Path

import higgsfield
from higgsfield.provision.wheels import NodePython, _platforms, build_id, build_wheel, runtime_requirements


def test_wheel_is_this_build_and_cached(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    assert wheel.name == f"higgsfield-{higgsfield.__version__}-py3-none-any.whl"
    assert wheel.parent.name == build_id() and build_id().startswith(higgsfield.__version__ + "+")
    names = zipfile.ZipFile(wheel).namelist()
    assert "higgsfield/remote/ssh.py" in names and any(n.startswith("higgsfield/templates/") for n in names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "higgsfield = higgsfield.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()
    start = time.monotonic()
    assert build_wheel(tmp_path) == wheel and time.monotonic() - start < 1  # from the cache


def test_requirements_pinned_and_platform_tags() -> None:
    reqs = runtime_requirements()
    assert any(r.startswith("asyncssh==") for r in reqs) and not any("torch" in r for r in reqs)
    tags = _platforms(NodePython("3.11", "x86_64", "2.36"))
    assert "manylinux_2_17_x86_64" in tags and "manylinux_2_36_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert _platforms(NodePython("3.12", "aarch64", None)) == ["linux_aarch64"]

"""``invoker facts`` read from disk (higgsfield.node.code.facts): a venv's packages, CUDA, NCCL, GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from higgsfield.node.code import facts as factsmod

pytestmark = pytest.mark.timeout(10)


def test_packages_cuda_and_nccl_come_from_the_files_of_the_venv(tmp_path: Path) -> None:
    site = tmp_path / "env" / "lib" / "python3.11" / "site-packages"
    for d in ("numpy-2.1.0.dist-info", "torch-2.6.0+cu124.dist-info", "nvidia_nccl_cu12-2.21.5.dist-info",
              "Jinja2-3.1.4.dist-info", "torch", "not_a_dist"):
        (site / d).mkdir(parents=True)
    (site / "torch" / "version.py").write_text("__version__ = '2.6.0+cu124'\ncuda: Optional[str] = '12.4'\n")
    (tmp_path / "env" / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.2\n")
    assert factsmod.site_packages(tmp_path / "env") == site
    pkgs = factsmod.packages(site)
    assert pkgs == {"numpy": "2.1.0", "torch": "2.6.0+cu124", "nvidia-nccl-cu12": "2.21.5", "jinja2": "3.1.4"}
    assert factsmod.torch_cuda(site) == "12.4" and factsmod.nccl(pkgs) == "2.21.5"
    assert factsmod._venv_python(tmp_path / "env") == "3.11.2"


def test_gpus_and_the_driver_come_from_proc_without_nvidia_smi(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(factsmod, "NVIDIA", tmp_path / "nvidia")
    assert factsmod.gpus() == (None, None, None)   # no driver: this machine
    (tmp_path / "nvidia" / "gpus" / "0000:01:00.0").mkdir(parents=True)
    (tmp_path / "nvidia" / "gpus" / "0000:02:00.0").mkdir(parents=True)
    (tmp_path / "nvidia" / "version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n")
    for d in (tmp_path / "nvidia" / "gpus").iterdir():
        (d / "information").write_text("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ: 1\n")
    assert factsmod.gpus() == ("550.54.14", "NVIDIA H100 80GB HBM3", 2)

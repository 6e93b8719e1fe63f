"""GPUs through NVML, and the fall-back to nvidia-smi where NVML is missing (higgsfield.node.runtime.gpus).

No GPU and no NVIDIA driver exist on this machine, so NVML is a stand-in module
here (the one place a fake may stand: a GPU); the missing-library path is real:
nvidia-ml-py is installed and finds no libnvidia-ml.
"""

from __future__ import annotations

import stat
import sys
import types
from pathlib import Path

import pytest

from higgsfield.contract.codec import encode
from higgsfield.node.observe.stats import Sampler
from higgsfield.node.runs.start import detect_gpus
from higgsfield.node.runtime.gpus import Nvml
from higgsfield.node.state.home import NodeState

pytestmark = pytest.mark.timeout(60)


class _NotSupported(Exception):
    pass


def _fake_nvml(gpus: int, log: list[str]) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVMLError = _NotSupported  # type: ignore[attr-defined]
    m.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    m.nvmlInit = lambda: log.append("init")  # type: ignore[attr-defined]
    m.nvmlShutdown = lambda: log.append("shutdown")  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = lambda: gpus  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = lambda h: b"NVIDIA H200"  # type: ignore[attr-defined]
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=87 + h)  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=1024**3, total=141 * 1024**3)  # type: ignore[attr-defined]

    def temperature(h: int, sensor: int) -> int:
        if h == 1:
            raise _NotSupported("Not Supported")
        return 61

    m.nvmlDeviceGetTemperature = temperature  # type: ignore[attr-defined]
    return m


def test_nvml_samples_every_gpu_and_a_figure_it_cannot_report_is_none(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(2, log))
    monkeypatch.setenv("PATH", str(tmp_path))   # no nvidia-smi: NVML alone must answer
    s = Sampler(NodeState(tmp_path), every=0.5)
    try:
        gpus = encode(s.sample())["gpus"]
    finally:
        s.close()
    assert [g["index"] for g in gpus] == [0, 1] and gpus[0]["name"] == "NVIDIA H200"
    assert gpus[0]["util_percent"] == 87 and gpus[1]["util_percent"] == 88
    assert gpus[0]["mem_used_mib"] == 1024 and gpus[0]["mem_total_mib"] == 141 * 1024
    assert gpus[0]["temperature_c"] == 61 and gpus[1]["temperature_c"] is None
    assert detect_gpus() == 2
    assert log.count("init") == log.count("shutdown") == 2   # the sampler's and detect_gpus' own


def test_without_nvml_the_node_falls_back_to_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Nvml.open() is None   # nvidia-ml-py is installed; the driver's library is not
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n"
                   'case "$1" in -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-1)";;\n'
                   '  *) echo "0, NVIDIA H200, 50, 100, 143771, 40";; esac\n')
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    s = Sampler(NodeState(tmp_path))
    try:
        gpus = encode(s.sample())["gpus"]
    finally:
        s.close()
    assert gpus == [{"index": 0, "name": "NVIDIA H200", "util_percent": 50.0, "mem_used_mib": 100.0,
                     "mem_total_mib": 143771.0, "temperature_c": 40.0}]
    assert detect_gpus() == 1

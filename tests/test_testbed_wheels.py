"""The test bed's wheel download tells a CUDA build of torch from higgsfield's own pure-Python nvidia-ml-py."""

from __future__ import annotations

from pathlib import Path

import pytest
from testbed import impl

pytestmark = pytest.mark.timeout(10)


def test_only_what_a_cuda_torch_pulls_in_counts_as_cuda(tmp_path: Path) -> None:
    cpu = ["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "nvidia_ml_py-13.615.71-py3-none-any.whl",
           "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl"]
    for name in cpu:
        (tmp_path / name).touch()
    assert impl.wheels.cuda_wheels(tmp_path) == []   # the image build refused this before: nvidia_ml_py
    for name in ("cuda_toolkit-13.0.3.0-py2.py3-none-any.whl", "nvidia_cublas_cu12-12.4.5.8-py3-none-any.whl"):
        (tmp_path / name).touch()
    assert impl.wheels.cuda_wheels(tmp_path) == ["cuda_toolkit-13.0.3.0-py2.py3-none-any.whl",
                                                 "nvidia_cublas_cu12-12.4.5.8-py3-none-any.whl"]

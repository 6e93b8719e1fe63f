"""This node's GPUs through NVML (nvidia-ml-py), the driver's own library; ``nvidia-smi`` where NVML is missing.

NVML answers in microseconds from this process, where ``nvidia-smi`` is a process
start per question (or one kept running beside the sampler). A node whose driver
ships no ``libnvidia-ml`` (or an install without nvidia-ml-py) falls back to
``nvidia-smi``; a node with neither has no GPUs. A figure a GPU cannot report
(NVML's ``NotSupported``) is None, as nvidia-smi's ``[N/A]`` is. Each GPU's sample is the contract's
:class:`~higgsfield.contract.feed.GpuSample`, the type the dashboard decodes it into.

Use::

    nvml = Nvml.open()          # None without NVML
    nvml.count(), nvml.sample() # 8, [GpuSample(index=0, name="NVIDIA H100 80GB HBM3", ...), ...]
    nvml.close()
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from higgsfield.contract.feed import GpuSample

MIB = 1024 * 1024
T = TypeVar("T")


class Nvml:
    """An initialised NVML (``nvmlInit``) for this process; :meth:`close` shuts it down."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib

    @classmethod
    def open(cls) -> Nvml | None:
        """NVML, initialised; None when nvidia-ml-py or the driver's library is missing."""
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:
            return None
        return cls(pynvml)

    def count(self) -> int:
        return int(self.lib.nvmlDeviceGetCount())

    def sample(self) -> list[GpuSample]:
        """One sample of every GPU, in index order."""
        return [self._one(i, self.lib.nvmlDeviceGetHandleByIndex(i)) for i in range(self.count())]

    def _one(self, index: int, h: Any) -> GpuSample:
        lib = self.lib
        name = self._ask(lambda: lib.nvmlDeviceGetName(h)) or ""
        util = self._ask(lambda: float(lib.nvmlDeviceGetUtilizationRates(h).gpu))
        mem = self._ask(lambda: lib.nvmlDeviceGetMemoryInfo(h))
        temp = self._ask(lambda: float(lib.nvmlDeviceGetTemperature(h, lib.NVML_TEMPERATURE_GPU)))
        return GpuSample(index, (name.decode() if isinstance(name, bytes) else str(name))[:200], util,
                         mem.used / MIB if mem is not None else None,
                         mem.total / MIB if mem is not None else None, temp)

    def _ask(self, question: Callable[[], T]) -> T | None:
        """One NVML figure, or None where this GPU cannot report it."""
        try:
            return question()
        except self.lib.NVMLError:
            return None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.lib.nvmlShutdown()

"""What a node's machine is doing: CPU, memory, disk, and each GPU (NVML, else ``nvidia-smi --query-gpu``).

One :class:`Sampler` per process: the dashboard keeps one ``higgsfield invoker stats
--follow`` running per node for its whole life (over the one SSH connection it holds),
so a sample costs a few ``/proc`` reads and no process start. GPUs come from NVML
(:mod:`higgsfield.node.runtime.gpus`) in this process; where NVML is missing, from one
``nvidia-smi --query-gpu=... -lms N`` that keeps running beside it and prints a line
per GPU every N ms (read by a thread; the latest line per GPU is the sample's); a
node with neither has ``gpus: []``. A sample is the contract's
:class:`~higgsfield.contract.feed.NodeSample` (each GPU a :class:`~higgsfield.contract.feed.GpuSample`):
the node builds and prints the type the dashboard decodes, so the feed's shape is written once.

Use::

    s = Sampler(home)                      # primes the CPU counters
    encode(s.sample())                     # {"time", "cpu_percent", "mem_used", ..., "gpus": [...]}
    s.close()
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import psutil

from higgsfield.contract.feed import GpuSample, NodeSample
from higgsfield.node.runtime.gpus import Nvml
from higgsfield.node.state.home import NodeState

GPU_FIELDS = ("index", "name", "utilization.gpu", "memory.used", "memory.total", "temperature.gpu")
SMI_TIMEOUT_S = 10.0


def parse_smi(text: str) -> dict[int, GpuSample]:
    """``nvidia-smi --query-gpu=GPU_FIELDS --format=csv,noheader,nounits`` lines -> GPU index -> sample.

    A value the driver cannot report (``[N/A]``, ``[Not Supported]``) is None; a line
    that does not fit is skipped.
    """
    out: dict[int, GpuSample] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(GPU_FIELDS):
            continue
        try:
            index = int(cells[0])
        except ValueError:
            continue
        out[index] = GpuSample(index, cells[1][:200], _number(cells[2]), _number(cells[3]), _number(cells[4]),
                               _number(cells[5]))
    return out


def _number(cell: str) -> float | None:
    """A figure of nvidia-smi's, or None (NaN and infinity too: they are no figure, and no JSON)."""
    try:
        v = float(cell)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _smi_argv(smi: str) -> list[str]:
    return [smi, f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"]


class _SmiLoop:
    """``nvidia-smi ... -lms N`` running beside the sampler; ``latest`` holds each GPU's last line."""

    def __init__(self, smi: str, every: float) -> None:
        self.latest: dict[int, GpuSample] = {}
        self._proc = subprocess.Popen([*_smi_argv(smi), f"-lms={max(100, int(every * 1000))}"],  # noqa: S603
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._read, daemon=True, name="nvidia-smi").start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self.latest.update(parse_smi(line))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=2)


class Sampler:
    """Samples this machine; ``every`` (seconds) paces the GPU loop when following."""

    def __init__(self, home: NodeState, *, every: float | None = None) -> None:
        self.disk_path = home.root if home.root.exists() else Path.home()
        self.nvml = Nvml.open()
        self.smi = None if self.nvml is not None else shutil.which("nvidia-smi")
        self._loop = _SmiLoop(self.smi, every) if self.smi and every else None
        psutil.cpu_percent(interval=None)     # the next call measures from here
        self._primed = time.monotonic()

    def _gpus(self) -> list[GpuSample]:
        if self.nvml is not None:
            with contextlib.suppress(self.nvml.lib.NVMLError):
                return self.nvml.sample()
            return []
        if self.smi is None:
            return []
        if self._loop is not None and self._loop.latest:
            return [self._loop.latest[i] for i in sorted(self._loop.latest)]
        try:
            out = subprocess.run(_smi_argv(self.smi), capture_output=True, text=True,  # noqa: S603
                                 timeout=SMI_TIMEOUT_S, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            return []
        found = parse_smi(out)
        return [found[i] for i in sorted(found)]

    def sample(self) -> NodeSample:
        if time.monotonic() - self._primed < 0.05:
            time.sleep(0.1)   # a first sample right after priming would measure nothing
        cpu = psutil.cpu_percent(interval=None)
        mem = psutil.virtual_memory()
        try:
            disk = psutil.disk_usage(str(self.disk_path))
            disk_used, disk_total = int(disk.used), int(disk.total)
        except OSError:
            disk_used = disk_total = 0
        return NodeSample(time=time.time(), cpu_percent=float(cpu), cpu_count=os.cpu_count() or 1,
                          load1=os.getloadavg()[0], mem_used=int(mem.total - mem.available),
                          mem_total=int(mem.total), disk_used=disk_used, disk_total=disk_total,
                          gpus=self._gpus())

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
        if self.nvml is not None:
            self.nvml.close()

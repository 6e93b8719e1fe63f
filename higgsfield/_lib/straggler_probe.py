"""This rank's own work per step: the step time less the time it waited in collectives.

:func:`higgsfield.training.progress` (every ``StepTimer.step``) calls :func:`step`. In a
run that higgsfield started with more than one rank, the first call starts a sampler
thread that looks where the training thread is (``sys._current_frames()``, in-process,
no ptrace) :data:`SAMPLE_HZ` times a second: a sample whose innermost Python frame is a
torch.distributed collective (``distributed_c10d.py``, ``_functional_collectives.py``:
what FSDP2, DeepSpeed and a plain ``dist.all_reduce`` call) is waiting. Each step's own
work is its time x (1 - the share of it spent waiting), the time between two samples
counted half for the state seen at either end (see :meth:`Probe._sample` for why). About twice a second
the mean over the steps since the last write goes to ``RUN_DIR/progress/work<RANK>``
(one fixed-width ``pwrite``: :func:`higgsfield.contract.straggler.work_line`), which the
node reads without torch (:mod:`higgsfield.node.runs.progress`).

Cost: nothing outside such a run (no thread, one attribute test per step). Inside it, a
sample takes a few microseconds of the GIL (bench/straggler.py measures the step time with
the probe on and off; docs/benchmarks.md). ``HIGGSFIELD_STRAGGLER_PROBE=0`` turns it off.

What it sees: a rank's CPU-side waits. With gloo (CPU) a collective blocks the calling
thread, so the share is exact up to sampling. With NCCL a collective is queued on a CUDA
stream and the thread waits later, at a synchronisation (``.item()``, ``synchronize``),
which this probe counts as work: a rank slowed by its host (data loading, a starved CPU,
Python) is found on GPUs too, one slowed by its GPU is not (that needs the collectives'
CUDA timings, NCCL's flight recorder).
"""

from __future__ import annotations

import os
import sys
import threading
import time

from higgsfield.contract.layout import work_path
from higgsfield.contract.straggler import RankWork, work_line

SAMPLE_HZ = 200.0     # samples a second of where the training thread is
WRITE_EVERY = 0.5     # seconds: a rank writes its own work at most this often
WAIT_FILES = ("distributed_c10d.py", "_functional_collectives.py")
"""A sample whose innermost Python frame is in one of these files waits in a collective."""
PROBE_ENV = "HIGGSFIELD_STRAGGLER_PROBE"


class Probe:
    """The sampler and the per-step accounting of one process (:data:`probe`)."""

    def __init__(self, *, run_dir: str | None = None, rank: int | None = None, hz: float = SAMPLE_HZ,
                 write_every: float = WRITE_EVERY) -> None:
        self._run_dir, self._rank, self._hz, self._write_every = run_dir, rank, hz, write_every
        self._off = False
        self._on = False
        self.total = 0.0        # seconds sampled, and of them waiting (the sampler thread writes both; read racily)
        self.waiting = 0.0
        self._ident = 0
        self._last_step: int | None = None
        self._last_t = 0.0
        self._last_total = self._last_waiting = 0.0
        self._acc_own = self._acc_step = 0.0
        self._acc_n = 0
        self._last_write = 0.0
        self._fd: int | None = None
        self._stop = threading.Event()

    def step(self, step: int) -> None:
        """The training thread closed ``step``; the first call starts the sampler (when it should run)."""
        if self._off or step == self._last_step:
            return
        now = time.perf_counter()
        if not self._on:
            if not self._start():
                return
            self._last_step, self._last_t, self._last_write = step, now, now
            return
        total, waiting = self.total, self.waiting
        dt = now - self._last_t
        n, w = total - self._last_total, waiting - self._last_waiting
        share = min(1.0, max(0.0, w / n)) if n > 0 else 0.0
        self._acc_own += dt * (1.0 - share)
        self._acc_step += dt
        self._acc_n += 1
        self._last_step, self._last_t, self._last_total, self._last_waiting = step, now, total, waiting
        if now - self._last_write >= self._write_every:
            self._write(step)
            self._last_write = now

    def close(self) -> None:
        self._stop.set()
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _start(self) -> bool:
        run_dir = self._run_dir if self._run_dir is not None else os.environ.get("HIGGSFIELD_RUN_DIR")
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if not run_dir or (self._rank is None and world < 2) or os.environ.get(PROBE_ENV, "1") == "0":
            self._off = True    # not a run of several ranks higgsfield started: nothing to compare
            return False
        rank = self._rank if self._rank is not None else int(os.environ.get("RANK", "0"))
        path = work_path(run_dir, rank)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError:
            self._off = True
            return False
        self._rank, self._ident, self._on = rank, threading.get_ident(), True
        threading.Thread(target=self._sample, name="higgsfield-straggler-probe", daemon=True).start()
        return True

    def _sample(self) -> None:
        """Time-weighted: each interval between two samples counts half for the state seen at either end. A count
        of samples would be biased: on a busy CPU this thread is scheduled later while its rank computes than
        while it sleeps in a collective, so the waits would get more samples than their share of the time."""
        period, ident, frames, stop = 1.0 / self._hz, self._ident, sys._current_frames, self._stop
        clock = time.perf_counter
        prev_t, prev_wait = clock(), 0.0
        while not stop.wait(period):
            f = frames().get(ident)
            now = clock()
            if f is None:
                return          # the training thread ended
            waiting = 1.0 if f.f_code.co_filename.endswith(WAIT_FILES) else 0.0
            dt = now - prev_t
            self.waiting += dt * (waiting + prev_wait) / 2
            self.total += dt
            prev_t, prev_wait = now, waiting

    def _write(self, step: int) -> None:
        if self._fd is None or self._acc_n == 0:
            return
        w = RankWork(rank=self._rank or 0, step=step, steps=self._acc_n, own_s=self._acc_own / self._acc_n,
                     step_s=self._acc_step / self._acc_n)
        try:
            os.pwrite(self._fd, work_line(w, time.time()), 0)
        except OSError:
            return    # a full disk: advisory, training goes on
        self._acc_own = self._acc_step = 0.0
        self._acc_n = 0


probe = Probe()


def step(step: int) -> None:
    """Account ``step`` (called by :func:`higgsfield.training.progress`)."""
    probe.step(step)

"""A live rank profiled on request: ``torch.profiler`` over its next N steps, armed from the node.

How a request reaches a rank: the node writes ``RUN_DIR/profile/request.json``
(:class:`~higgsfield.contract.profile.ProfileRequest`); :func:`poll` stats it at most once
a second, called by :func:`higgsfield.training.progress` right after its own once-a-second
progress write. A new request for this rank sets :attr:`Armed.active`, the one boolean the
step loop checks (``progress`` calls :meth:`Armed.step` only while it is set). At the next
step boundary the profiler starts; ``steps`` boundaries later it stops, the Chrome trace is
written to ``RUN_DIR/profile/<id>/rank<N>.trace.json`` (a temporary name, then renamed) and
``rank<N>.done.json`` last. With ``memory`` on a GPU, CUDA's allocator history is recorded
over the same steps and dumped as ``rank<N>.memory.pickle`` (pytorch.org/memory_viz reads it).

Why a file read beside the progress write, not a signal as ``stacks`` uses: a request file
reaches every rank the same way in the process runtime, in a container and in a Slurm job's
shared run directory, with no host pid to find; and a rank that never set a handler cannot be
killed by a signal's default action. The cost when nothing is asked: one ``stat`` a second,
inside a write that happens anyway, and one attribute test per step. Nothing here raises into
the training loop: a profiler failure is written as the rank's ``error``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.decode import DecodeError, read_json
from higgsfield.contract.profile import (
    ProfileRequest,
    RankDone,
    done_name,
    memory_name,
    request_path,
    results_dir,
    trace_name,
)
from higgsfield.metrics import RUN_DIR_ENV


class Armed:
    """This rank's profiling state: ``active`` while a request is taken (the step loop's one boolean)."""

    def __init__(self) -> None:
        self.active = False
        self._seen: int | None = None     # the request file's mtime_ns last read
        self._req: ProfileRequest | None = None
        self._prof: Any = None
        self._steps: list[int] = []
        self._t0 = 0.0
        self._mark: Any = None            # the open ``ProfilerStep#<step>`` range of the step being profiled

    def poll(self) -> None:
        """Read the request file if it changed; take a request meant for this rank (see the module)."""
        if self.active:
            return
        run_dir = os.environ.get(RUN_DIR_ENV)
        if not run_dir:
            return
        path = request_path(run_dir)
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return
        if mtime == self._seen:
            return
        self._seen = mtime
        try:
            req = decode(ProfileRequest, read_json(path))
        except (OSError, DecodeError, ValueError):
            return
        rank = _rank()
        if req.deadline < time.time() or (req.ranks and rank not in req.ranks) \
                or (results_dir(run_dir, req.id) / done_name(rank)).exists():
            return
        self._req, self.active = req, True

    def step(self, step: int) -> None:
        """At the end of ``step``: start the profiler (the first call), mark a step, or stop and write."""
        req = self._req
        if req is None:
            self.active = False
            return
        try:
            if self._prof is None:
                self._start(req)
                self._open_step(step + 1)
                return
            self._close_step()
            self._steps.append(step)
            if len(self._steps) >= req.steps:
                self._finish(req)
            else:
                self._open_step(step + 1)
        except Exception as e:  # noqa: BLE001 - profiling never ends the run: say why on the rank's file
            self._give_up(req, f"{type(e).__name__}: {e}")

    def _start(self, req: ProfileRequest) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
            if req.memory:
                torch.cuda.memory._record_memory_history(max_entries=100_000)
        self._prof = profile(activities=activities, record_shapes=False, with_stack=False)
        self._prof.start()
        self._steps, self._t0 = [], time.perf_counter()

    def _open_step(self, step: int) -> None:
        """Mark the next step in the trace as ``ProfilerStep#<step>`` (what Perfetto and TensorBoard group by)."""
        from torch.autograd.profiler import record_function

        self._mark = record_function(f"ProfilerStep#{step}")
        self._mark.__enter__()

    def _close_step(self) -> None:
        mark, self._mark = self._mark, None
        if mark is not None:
            mark.__exit__(None, None, None)

    def _finish(self, req: ProfileRequest) -> None:
        import torch

        seconds = time.perf_counter() - self._t0
        prof, self._prof = self._prof, None
        prof.stop()
        out = results_dir(os.environ[RUN_DIR_ENV], req.id)
        out.mkdir(mode=0o700, parents=True, exist_ok=True)
        rank = _rank()
        tmp = out / f".{trace_name(rank)}.tmp"
        prof.export_chrome_trace(str(tmp))
        os.chmod(tmp, 0o600)
        tmp.replace(out / trace_name(rank))
        cuda = torch.cuda.is_available()
        memory, note = "", ""
        if req.memory and cuda:
            torch.cuda.memory._dump_snapshot(str(out / memory_name(rank)))
            torch.cuda.memory._record_memory_history(enabled=None)
            memory = memory_name(rank)
        elif req.memory:
            note = "no CUDA memory snapshot: this rank runs on CPU"
        self._done(req, RankDone(rank=rank, steps=list(self._steps), device="cuda" if cuda else "cpu",
                                 memory=memory, memory_note=note, seconds=round(seconds, 6)))

    def _give_up(self, req: ProfileRequest, why: str) -> None:
        prof, self._prof = self._prof, None
        if prof is not None:
            try:
                self._close_step()
                prof.stop()
            except Exception:  # noqa: BLE001, S110 - already failing: the error below is what is said
                pass
        try:
            self._done(req, RankDone(rank=_rank(), steps=list(self._steps), error=why[:2000]))
        except OSError:
            self._req, self.active = None, False

    def _done(self, req: ProfileRequest, done: RankDone) -> None:
        self._req, self.active = None, False
        out = results_dir(os.environ[RUN_DIR_ENV], req.id)
        out.mkdir(mode=0o700, parents=True, exist_ok=True)
        import json

        tmp = out / f".{done_name(done.rank)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(encode(done), f)
        tmp.replace(out / done_name(done.rank))


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


armed = Armed()


def poll() -> None:
    """Look for a profile request (the progress writer calls it at most once a second)."""
    armed.poll()

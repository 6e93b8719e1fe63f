"""What torchrun runs in every worker: import the experiment's module and call it.

    torchrun ... -m higgsfield.node.entrypoint RUN_DIR

``RUN_DIR/spec.json`` names the experiment, its module under ``src/`` and the raw
param values. Each rank's stdout and stderr go to ``RUN_DIR/logs/rank<RANK>.log``
(appended, so a restarted worker continues the same file) through a pipe read by a
small tee process forked before any user code (or torch) is imported: it appends
exactly the bytes it reads and keeps ``rank<RANK>.idx``, lines ``OFFSET UNIXTIME``
(the offset of the first byte of a line that arrived at that time, at least
``INDEX_EVERY`` seconds apart; the format is :mod:`higgsfield.node.observe.logindex`'s),
which ``logs --since`` uses. However the worker
dies, even by SIGKILL, the pipe closes and the tee writes everything left in it
before it exits; it ignores SIGINT/SIGTERM for that (a SIGKILL of the worker's
process group ends it too). It holds a shared ``flock`` on the index while it
runs, so a reader can tell the log is drained. A worker that raises
writes ``rank<RANK>.error.json`` with the time, so ``status`` can name the rank
that failed first. A worker that ends without a Python exception and without
reaching a clean exit (SIGKILL from the OOM killer, SIGSEGV, SIGABRT, ``os._exit``)
gets its ``rank<RANK>.error.json`` from the tee, which sees the pipe close at the
moment it dies, so the first failure across nodes is named by its real time; a clean
exit leaves ``rank<RANK>.done`` first. Before user code runs, the worker arms a
``faulthandler`` on :data:`~higgsfield.node.runs.stacks.STACKS_SIGNAL` (SIGRTMIN+7,
which neither torchrun nor Slurm sends): the node takes every rank's stacks at a
stall (or for ``higgsfield stacks``) without ptrace. The worker dies with its torchrun
(PR_SET_PDEATHSIG), so a killed launcher leaves no orphans. Secrets are already in
the environment (torchrun inherits them from the supervisor, or in a container from
the launcher, :mod:`higgsfield.node.runtime.launch`). Logs, indexes and markers are private
to the node user (0600).

Leaving (:func:`leave`): a finished worker tears down like the interpreter would
(non-daemon threads joined, atexit handlers run, stdio flushed, the process group
destroyed) and then ends with ``os._exit``, skipping interpreter finalization.
That is the fix for ranks that aborted *after* finishing (``terminate called
without an active exception``, SIGABRT): a gloo worker thread (``pt_gloo_runloop``)
drops its reference to a completed collective (an ``AsyncWork`` holding tensors
with Python objects) just after ``wait()`` returned in the main thread. Dropping
it needs the GIL; once ``Py_FinalizeEx`` has begun, a thread taking the GIL is
ended with ``pthread_exit``, whose forced unwind through the work's ``noexcept``
destructor calls ``std::terminate``. ``destroy_process_group()`` does not close that
window: it joins the gloo threads only when the last reference to the group goes,
and once ``torch._dynamo`` is imported (``torch.optim`` does it) the group stays
referenced until finalization. Without finalization there is no window.
"""

from __future__ import annotations

import atexit
import importlib
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import NoReturn

from higgsfield.contract.layout import LOGS, SPEC
from higgsfield.contract.runspec import RunSpec
from higgsfield.node.observe import logindex
from higgsfield.node.state.placement import read_run_spec

_READ = 1 << 16


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _redirect(logs: Path, rank: int) -> None:
    """Point fds 1 and 2 at a pipe drained by a forked tee into ``rank<N>.log`` (+ ``.idx``)."""
    logs.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(logs / f"rank{rank}.log", os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        ifd = os.open(logs / f"rank{rank}.idx", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        r, w = os.pipe()
        pid = os.fork()
    except OSError:  # no index, pipe or fork: write the file directly (no --since for this rank)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    else:
        if pid == 0:  # the tee: never returns
            code = 1
            try:
                started = time.time()
                _tee_child(r, fd, ifd)
                _note_death(logs, rank, started)
                code = 0
            finally:
                os._exit(code)
        os.close(r)
        os.close(ifd)
        os.dup2(w, 1)
        os.dup2(w, 2)
        os.close(w)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]


def _tee_child(r: int, fd: int, ifd: int) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # outlive the worker long enough to drain; SIGKILL still ends it
    null = os.open(os.devnull, os.O_RDWR)
    keep = sorted({r, fd, ifd, null})
    low = 0
    for k in keep:  # close every inherited fd but these: above all the pipe's write end, or no EOF ever
        os.closerange(low, k)
        low = k + 1
    os.closerange(low, max(os.sysconf("SC_OPEN_MAX"), 1024))
    for i in range(3):
        if i not in (r, fd, ifd):
            os.dup2(null, i)
    tee(r, fd, ifd)


def tee(src: int, fd: int, ifd: int) -> None:
    """Append all read from ``src`` to ``fd`` (a log opened O_RDWR|O_APPEND) until EOF; index lines in ``ifd``.

    The index (``OFFSET UNIXTIME`` lines, at least ``INDEX_EVERY`` seconds apart) is
    :mod:`higgsfield.node.observe.logindex`'s format; the tee holds it while it runs.
    """
    logindex.hold(ifd)  # held until exit: "a tee still writes this log"
    size = os.fstat(fd).st_size
    index = logindex.IndexWriter(at_line_start=size == 0 or os.pread(fd, 1, size - 1) == b"\n")
    while True:
        chunk = os.read(src, _READ)
        if not chunk:
            return
        now = time.time()
        try:
            start = _write_all(fd, chunk)
        except OSError:  # disk full or the like: keep draining, or the worker would block or get EPIPE
            continue
        line = index.entry(start, chunk, now)
        if line is not None:
            try:
                os.write(ifd, line)
                index.wrote(now)
            except OSError:
                pass


def _note_death(logs: Path, rank: int, started: float) -> None:
    """At the tee's EOF: if the worker neither exited cleanly nor recorded an error, record that it died now."""
    from higgsfield.contract.codec import decode
    from higgsfield.contract.decode import read_json
    from higgsfield.node.runs.failure import RankError

    if (logs / f"rank{rank}.done").exists():
        return
    try:
        if decode(RankError, read_json(logs / f"rank{rank}.error.json")).time >= started:
            return  # the worker recorded its own exception (this attempt's, not a restarted one's)
    except (OSError, ValueError):
        pass
    _record_error(logs, rank, "ended without a Python exception (a signal: SIGKILL from the OOM killer, "
                              "SIGSEGV, SIGABRT; or os._exit)", kind="died")


def _write_all(fd: int, data: bytes) -> int:
    """Write all of ``data`` (append mode); return the file offset its first byte went to."""
    view = memoryview(data)
    start = -1
    while view:
        n = os.write(fd, view)
        if start < 0:
            start = os.lseek(fd, 0, os.SEEK_CUR) - n
        view = view[n:]
    return start


def main(argv: list[str] | None = None, *, hard_exit: bool = False) -> int:
    """Run the experiment of ``RUN_DIR`` as this rank; with ``hard_exit``, end the process (see :func:`leave`)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m higgsfield.node.entrypoint RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    rank = int(os.environ.get("RANK", "0"))
    logs = run_dir / LOGS
    _die_with_parent()
    (logs / f"rank{rank}.done").unlink(missing_ok=True)  # a restarted worker starts unfinished
    _redirect(logs, rank)
    _write_private(logs / f"rank{rank}.pid", str(os.getpid()))
    from higgsfield.node.runs.stacks import arm

    arm(run_dir, rank)
    try:
        code = run(read_run_spec(run_dir / SPEC))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code:
            _record_error(logs, rank, f"SystemExit({e.code})", code=code)
    except BaseException as e:  # noqa: BLE001 - report every failure of user code
        from higgsfield.contract.errors import HiggsfieldError

        if isinstance(e, HiggsfieldError) and e.exit_code == 2:   # an option the user chose refused (DiLoCo's)
            print(f"error: {e}", file=sys.stderr, flush=True)         # one line, no traceback: the user's to fix
            code = 2
        else:
            traceback.print_exc()
            code = 1
        _record_error(logs, rank, f"{type(e).__name__}: {e}", code=code)
    if hard_exit:
        leave(code, logs / f"rank{rank}.done")
    return code


def leave(code: int, done: Path | None = None) -> NoReturn:
    """End this worker as the interpreter would, then ``os._exit(code)``: no finalization, no exit abort.

    In the order of ``Py_FinalizeEx``: non-daemon threads are joined (their
    ``threading`` exit hooks first, so idle executor workers quit), atexit handlers
    run, then, after a clean run, the default process group is destroyed (NCCL
    finishes its work; a group still referenced elsewhere is left to ``_exit``).
    ``done`` is written last, so the tee tells a clean exit from a death.
    """
    try:
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()
        atexit._run_exitfuncs()
        if code == 0:
            _destroy_process_group()
    except BaseException:  # noqa: BLE001 - an exit hook failed: report it, the run failed
        traceback.print_exc()
        code = code or 1
    if code == 0 and done is not None:
        _write_private(done, "0")
    _flush_all()
    os._exit(code)


def _destroy_process_group() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _flush_all() -> None:
    """Python's and the C library's buffered output (``os._exit`` flushes neither)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def run(spec: RunSpec) -> int:
    """Import the experiment's module from the run's (pinned) code and call the experiment with its params."""
    code_dir = Path(spec.code_dir)
    src_dir = code_dir / spec.src_dir
    for p in (str(code_dir), str(src_dir)):
        if p not in sys.path:
            sys.path.insert(0, p)
    from higgsfield.experiment import registry, seed_everything
    from higgsfield.node.runtime.attempts import isolate_restart_store

    isolate_restart_store()   # a restarted worker must not read the dead workers' addresses
    importlib.import_module(spec.module)
    exp = registry().get(spec.experiment)
    if exp is None:
        raise RuntimeError(f"module {spec.module} did not register experiment '{spec.experiment}'")
    params = exp.build_params(spec.params)
    if exp.seed is not None:
        seed_everything(exp.seed)
    exp.func(params)
    return 0


def _record_error(logs: Path, rank: int, message: str, kind: str = "exception", code: int | None = None) -> None:
    """``rank<N>.error.json``: the rank, when, what (one line), ``kind`` (exception | died) and its exit code."""
    try:
        from higgsfield.contract.codec import encode
        from higgsfield.node.runs.failure import RankError
        from higgsfield.node.state.records import write_json

        write_json(logs / f"rank{rank}.error.json",
                   encode(RankError(rank=rank, time=time.time(), error=message[:2000], kind=kind, code=code)))
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main(hard_exit=True))  # only a usage error returns

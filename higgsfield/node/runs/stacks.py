"""Every live rank's stacks of a run on this node, taken without ptrace: each worker dumps its own on a signal.

The worker side (:func:`arm`, called by :mod:`higgsfield.node.entrypoint` before any
user code): ``faulthandler.register(STACKS_SIGNAL, file, all_threads=True)`` on
``RUN_DIR/stacks/rank<N>`` opened O_APPEND, and ``RUN_DIR/stacks/rank<N>.json`` saying
its pid (the container's, in the Docker runtime) and its main thread's ident.
faulthandler writes from its C signal handler without the GIL, so a rank stuck in C
code that holds the GIL (a native call through ``ctypes.PyDLL``, a CUDA sync) still
answers, and no ptrace permission is needed (Ubuntu's ``ptrace_scope=1`` forbids it).

:data:`STACKS_SIGNAL` is ``SIGRTMIN+7``: torchrun forwards SIGTERM/SIGINT/SIGHUP/SIGQUIT,
Slurm sends SIGTERM/SIGKILL/SIGCONT and, with ``--signal``, usually SIGUSR1/SIGUSR2;
no one sends this one, and its default action (terminate) never applies because
:func:`take` signals only a worker that wrote its ``.json`` after arming.

The node side (:func:`take`): for each rank that armed, find the live worker (the pid
it wrote, or in the Docker runtime the host process of the same uid whose environment
has this ``HIGGSFIELD_RUN_DIR`` and ``RANK`` and whose innermost pid namespace pid is
the one it wrote), truncate its dump file, signal it, wait until the dumps settle,
parse them (:func:`higgsfield.contract.stacks.parse_faulthandler`) and read each
frame's source line here (linecache: the code is at the same path in a container).
With ``py-spy`` on ``PATH`` and ptrace allowed, its ``--native`` dump is added
(short timeout; never required). :func:`save` / :func:`saved` keep the stacks taken
at a stall in ``RUN_DIR/stacks.json``.
"""

from __future__ import annotations

import faulthandler
import json
import linecache
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, ClassVar

from higgsfield.contract import layout
from higgsfield.contract.codec import decode, encode
from higgsfield.contract.decode import DecodeError, read_json
from higgsfield.contract.stacks import Frame, RankStacks, SavedStacks, Thread, parse_faulthandler
from higgsfield.node.state.records import RunDir, write_json

STACKS_SIGNAL = signal.SIGRTMIN + 7
SETTLE_S = 0.15          # a dump whose size stayed the same this long is complete
PY_SPY_S = 3.0
RUN_DIR_VAR = layout.RUN_DIR_VAR

_armed: IO[str] | None = None   # the worker's dump file: kept open for faulthandler


# -- the worker's side ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Armed:
    """``stacks/rank<N>.json``: how the node finds an armed worker (its pid, its main thread's ident)."""

    WHAT: ClassVar[str] = "armed rank"

    pid: int
    main: int
    time: float = 0.0



def arm(run_dir: Path, rank: int) -> None:
    """In a worker: dump all threads to ``stacks/rank<N>`` on :data:`STACKS_SIGNAL`; say how to find it."""
    global _armed
    path = layout.stacks_dump_path(run_dir, rank)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)
        f = os.fdopen(fd, "w")
        faulthandler.register(STACKS_SIGNAL, file=f, all_threads=True, chain=False)
        _armed = f
        main = threading.main_thread().ident or 0
        write_json(path.with_name(f"rank{rank}.json"), encode(Armed(pid=os.getpid(), main=main, time=time.time())))
    except (OSError, ValueError, RuntimeError):
        pass   # no stacks for this rank: the run itself goes on


# -- the node's side -----------------------------------------------------------------------------

def _ranks(rd: RunDir) -> dict[int, Armed]:
    """Each rank that armed: its ``rank<N>.json`` (pid, main thread ident)."""
    out: dict[int, Armed] = {}
    d = rd.path / layout.STACKS
    try:
        names = os.listdir(d)
    except OSError:
        return out
    for name in names:
        if not (name.startswith("rank") and name.endswith(".json") and name[4:-5].isdigit()):
            continue
        try:
            out[int(name[4:-5])] = decode(Armed, read_json(d / name, root=rd.home.root))
        except (OSError, DecodeError):
            continue
    return out


def _ns_pid(pid: int) -> int | None:
    """``pid``'s pid in its innermost pid namespace (itself outside containers)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return pid


def _is_rank(p: Any, rd: RunDir, rank: int, inner_pid: int) -> bool:
    import psutil

    try:
        env = p.environ()
        return (env.get(RUN_DIR_VAR) == str(rd.path) and env.get("RANK") == str(rank)
                and p.status() != psutil.STATUS_ZOMBIE and _ns_pid(p.pid) == inner_pid)
    except (psutil.Error, OSError):
        return False


def _host_pid(rd: RunDir, rank: int, inner_pid: int) -> int | None:
    """The live worker of ``rank``: the pid it wrote (process runtime) or its host pid (a container's)."""
    import psutil

    try:
        if _is_rank(psutil.Process(inner_pid), rd, rank, inner_pid):
            return inner_pid
    except psutil.Error:
        pass
    uid = os.getuid()
    for p in psutil.process_iter(["uids"]):
        try:
            if p.info["uids"] is not None and p.info["uids"].real == uid and p.pid != inner_pid \
                    and _is_rank(p, rd, rank, inner_pid):
                return int(p.pid)
        except psutil.Error:
            continue
    return None


def armed(rd: RunDir) -> dict[int, Armed]:
    """Each rank that armed, by rank (its pid may live on another machine: a Slurm run's shared directory)."""
    return _ranks(rd)


def live_workers(rd: RunDir, ranks: Collection[int] | None = None) -> dict[int, int]:
    """The run's live workers on this node that armed (``ranks``: only those): rank -> host pid."""
    out = {}
    for rank, meta in sorted(_ranks(rd).items()):
        if ranks is not None and rank not in ranks:
            continue
        pid = _host_pid(rd, rank, meta.pid)
        if pid is not None:
            out[rank] = pid
    return out


def kill_workers(rd: RunDir, ranks: Collection[int] | None = None) -> int:
    """SIGKILL the run's live workers here (torchrun restarts them); how many were signalled."""
    n = 0
    for pid in live_workers(rd, ranks).values():
        try:
            os.kill(pid, signal.SIGKILL)
            n += 1
        except OSError:
            continue
    return n


def take(rd: RunDir, node: str, *, timeout: float = 3.0, ranks: Collection[int] | None = None) -> list[RankStacks]:
    """The stacks of the run's live ranks on this node (by rank); a rank that does not answer within
    ``timeout`` is listed with no threads. ``ranks``: only those (a Slurm run's directory is shared by
    every node of its job: each node takes its own ranks)."""
    metas = _ranks(rd)
    targets = [(rank, pid, metas[rank].main) for rank, pid in live_workers(rd, ranks).items()]
    signalled = []
    for rank, pid, main in targets:
        dump = layout.stacks_dump_path(rd.path, rank)
        try:
            os.truncate(dump, 0)
            os.kill(pid, STACKS_SIGNAL)
        except OSError:
            continue
        signalled.append((rank, pid, main, dump))
    natives = _py_spy([pid for _, pid, _, _ in signalled], min(timeout, PY_SPY_S))
    _settle([d for *_, d in signalled], timeout)
    for n in natives.values():
        n.join()
    out = []
    for rank, pid, main, dump in signalled:
        try:
            text = dump.read_text(errors="replace")
        except OSError:
            text = ""
        threads = tuple(Thread(t.name, tuple(_with_code(f) for f in t.frames))
                        for t in parse_faulthandler(text, main))
        native = natives.get(pid)
        out.append(RankStacks(node=node, rank=rank, pid=pid, threads=threads,
                              native=native.result if native is not None else ""))
    return out


def _settle(dumps: list[Path], timeout: float) -> None:
    """Wait until every dump is non-empty and has not grown for :data:`SETTLE_S` (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    sizes: dict[Path, int] = {}
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        now_sizes = {}
        for d in dumps:
            try:
                now_sizes[d] = os.stat(d).st_size
            except OSError:
                now_sizes[d] = 0
        if now_sizes != sizes:
            sizes, stable_since = now_sizes, time.monotonic()
        elif all(sizes.values()) and time.monotonic() - stable_since >= SETTLE_S:
            return
        time.sleep(0.03)


def _with_code(f: Frame) -> Frame:
    if not f.file or f.line <= 0:
        return f
    try:
        code = linecache.getline(f.file, f.line).strip()
    except (OSError, UnicodeError, SyntaxError):
        code = ""
    return replace(f, code=code[:500]) if code else f


class _Native(threading.Thread):
    """``py-spy dump --native`` of one pid, in the background (empty on any failure)."""

    def __init__(self, exe: str, pid: int, timeout: float) -> None:
        super().__init__(name=f"py-spy-{pid}", daemon=True)
        self.exe, self.pid, self.timeout = exe, pid, timeout
        self.result = ""

    def run(self) -> None:
        try:
            done = subprocess.run([self.exe, "dump", "--native", "--pid", str(self.pid)], capture_output=True,
                                  text=True, timeout=self.timeout, check=False)
            if done.returncode == 0:
                self.result = done.stdout[-16000:]
        except (OSError, subprocess.SubprocessError):
            pass


def _ptrace_allowed() -> bool:
    """No Yama, or Yama's classic mode: a process may trace another of its uid (else py-spy is not tried)."""
    try:
        return Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip() == "0"
    except OSError:
        return True


def _py_spy(pids: list[int], timeout: float) -> dict[int, _Native]:
    exe = shutil.which("py-spy")
    if exe is None or not pids or os.environ.get("HIGGSFIELD_NO_PY_SPY") or not _ptrace_allowed():
        return {}
    out = {pid: _Native(exe, pid, timeout) for pid in pids}
    for t in out.values():
        t.start()
    return out


def save(rd: RunDir, stacks: list[RankStacks]) -> None:
    """Keep ``stacks`` (taken at a stall) as ``RUN_DIR/stacks.json``."""
    write_json(rd.path / layout.STACKS_FILE, encode(SavedStacks(ranks=tuple(stacks), taken_at=time.time())))


def saved(rd: RunDir) -> list[RankStacks] | None:
    """The stacks saved at the run's stall on this node; None when it never stalled here (or the file does not
    decode)."""
    try:
        return list(decode(SavedStacks, read_json(rd.path / layout.STACKS_FILE, root=rd.home.root,
                                                  limit=32 << 20)).ranks)
    except (OSError, DecodeError):
        return None


def dumps(stacks: list[RankStacks]) -> str:
    """The JSON of ``stacks`` (a list of :class:`RankStacks`)."""
    return json.dumps(encode(stacks))

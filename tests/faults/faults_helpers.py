"""Helpers of the fault tests: the project on hosts 8..10, node processes, SSH sessions, timings.

Every fault test prints one line ``FAULT <name>: <figure>`` with what it measured; those
lines are the figures in docs/benchmarks.md ("Faults survived").
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import pwd
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runs_helpers import STATE, Cluster, exe, lines_by_rank, node_processes, run_processes  # noqa: F401 - re-exported

INDICES = (8, 9, 10)
PROJECT = "hffault"

# An experiment that checkpoints with higgsfield.checkpoint and says where it resumed.
CKPT_STEPS = '''\
"""Trains a linear layer, checkpointing every few steps; prints each step with its attempt number."""
import os
import time

from higgsfield.experiment import experiment, param


@experiment("ckpt_steps", seed=0)
@param("steps", default=40)
@param("every", default=5)
@param("width", default=32, description="the layer's width: a checkpoint is about 12 * width**2 bytes")
@param("keep_last", default=2)
@param("step_sleep", default=0.2)
def ckpt_steps(params):
    import torch
    import torch.distributed as dist

    from higgsfield.checkpoint import Checkpoint
    from higgsfield.training import init_distributed

    init_distributed()
    model = torch.nn.Linear(params.width, params.width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt = Checkpoint(model, opt, every=params.every, keep_last=params.keep_last)
    start = ckpt.load_latest()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    print(f"attempt {attempt} resumes at step {start} from {ckpt.directory}", flush=True)
    for step in range(start, params.steps):
        loss = model(torch.randn(8, params.width)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if dist.get_world_size() > 1:
            for p in model.parameters():
                dist.all_reduce(p.grad)
        opt.step()
        print(f"step {step} attempt {attempt}", flush=True)
        if ckpt.maybe_save(step):
            print(f"saved step_{step + 1:08d}", flush=True)
        time.sleep(params.step_sleep)
    ckpt.wait()
    dist.destroy_process_group()
'''


@functools.cache
def bench(name: str) -> Any:
    """A script of bench/ as a module (bench/ is no package), loaded once."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", Path(__file__).resolve().parents[2] / "bench"
                                                  / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


#: bench/straggler.py's experiment: fixed work per step (matmuls, then a sleep); one rank does factor x as much from
#: slow_from on; rank 0 writes its step timeline to its run directory.
SLOW_RANK: str = bench("straggler").JOB


# An experiment whose ranks on one node (slow_node) take factor x longer per step from slow_from on.
SLOW_NODE = '''\
"""Steps of a fixed length; the ranks on slow_node take factor times as long from step slow_from on."""
import os
import time

from higgsfield.experiment import experiment, param


@experiment("slow_node", seed=0)
@param("steps", default=40)
@param("work", default=0.1)
@param("slow_node", default="")
@param("slow_from", default=8)
@param("factor", default=2.0)
def slow_node(params):
    import torch
    import torch.distributed as dist

    from higgsfield.training import init_distributed, progress

    init_distributed()
    here = os.environ.get("HIGGSFIELD_NODE", "")
    t = torch.ones(1024)
    for step in range(1, params.steps + 1):
        time.sleep(params.work * (params.factor if here == params.slow_node and step >= params.slow_from else 1.0))
        dist.all_reduce(t)
        progress(step)
        print(f"step {step} on {here}", flush=True)
    dist.destroy_process_group()
'''


class Hooks:
    """A webhook on loopback that keeps what apprise's ``json://`` posts: (run, event, body) in order."""

    def __init__(self) -> None:
        self.secret = f"hook-{uuid.uuid4().hex}"
        self.got: list[tuple[str, str, str]] = []
        hooks = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if self.path == f"/{hooks.secret}":
                    title = body["title"].split()   # "higgsfield: run NAME EVENT"
                    hooks.got.append((title[2], title[3], body["message"]))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        with socket.socket() as s:   # a port nobody listens on: the dead destination
            s.bind(("127.0.0.1", 0))
            self.dead_port = s.getsockname()[1]

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self.server.server_address[1]}/{self.secret}"

    def events(self, run: str) -> list[str]:
        return [e for r, e, _ in self.got if r == run]

    def body(self, run: str, event: str) -> str:
        return next(b for r, e, b in self.got if (r, e) == (run, event))


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def report(fault: str, figure: str) -> None:
    """The one line per fault that docs/benchmarks.md quotes."""
    print(f"\nFAULT {fault}: {figure}", flush=True)


@dataclass
class FaultCluster(Cluster):
    indices: tuple[int, ...] = field(default=INDICES)

    def run_dir(self, i: int, run: str) -> Path:
        return self.home(i) / STATE / "runs" / PROJECT / run

    def rank_log(self, i: int, run: str, rank: int | None = None) -> Path:
        rank = self.indices.index(i) if rank is None else rank  # one process per node: rank = node rank
        return self.run_dir(i, run) / "logs" / f"rank{rank}.log"

    def record(self, i: int, run: str) -> dict[str, Any]:
        """The run's record on node i, read from its disk (as root), not through the control side."""
        try:
            return dict(json.loads((self.run_dir(i, run) / "run.json").read_text()))
        except (OSError, ValueError):
            return {}

    def status(self) -> dict[str, dict[str, Any]]:
        r = self.hf("status", "--json", timeout=120)
        return {x["run"]: x for x in json.loads(r.stdout)["runs"]} if r.stdout.strip().startswith("{") else {}

    def ckpt_dir(self, i: int, experiment: str, run: str) -> Path:
        return self.home(i) / ".cache" / "higgsfield" / PROJECT / "experiments" / experiment / run

    def container(self, experiment: str, run: str, i: int) -> str:
        return f"hf-{PROJECT}-{experiment}-{run}-hfnode{i}"


def containers(run: str) -> list[str]:
    out = subprocess.run([exe("docker"), "ps", "-a", "--format", "{{.Names}}", "--filter",
                          "label=org.higgsfield.run=" + run], capture_output=True, text=True, check=True).stdout
    return out.split()


def log_has(path: Path, text: str) -> bool:
    try:
        return text in path.read_text(errors="replace")
    except OSError:
        return False



def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def worker_pid(run_dir: Path, rank: int) -> int | None:
    """The training worker of ``rank`` (not torchrun, not the launcher), seen from the host."""
    for pid in run_processes(run_dir):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"higgsfield.node.entrypoint" in cmd and b"torch.distributed.run" not in cmd and f"RANK={rank}".encode() in env:
            # the tee is a fork of the worker: the worker is the one whose parent is not a worker
            try:
                ppid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
                pcmd = open(f"/proc/{ppid}/cmdline", "rb").read().split(b"\0")
            except (OSError, ValueError, IndexError):
                continue
            if not (b"higgsfield.node.entrypoint" in pcmd and b"torch.distributed.run" not in pcmd):
                return pid
    return None


def _parent(pid: int) -> int | None:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def sshd_sessions_running(i: int, *needles: str) -> list[int]:
    """The sshd processes ("sshd: hfnodeI@notty" and its "[priv]" parent) serving a command on node i
    whose command line holds every needle: killing them drops that SSH connection, nothing else."""
    uid = pwd.getpwnam(f"hfnode{i}").pw_uid
    sessions: set[int] = set()
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        pid = int(e)
        try:
            if os.stat(f"/proc/{e}").st_uid != uid:
                continue
        except OSError:
            continue
        cmd = _cmdline(pid)
        if not cmd.startswith("sshd") and all(n in cmd for n in needles):
            p = _parent(pid)
            while p and p > 1:
                c = _cmdline(p)
                if c.startswith("sshd:") and "@" in c:
                    sessions.add(p)
                    priv = _parent(p)
                    if priv and _cmdline(priv).startswith("sshd:") and "[priv]" in _cmdline(priv):
                        sessions.add(priv)
                    break
                p = _parent(p)
    return sorted(sessions)



def kill_run_quietly(c: FaultCluster, run: str) -> None:
    with contextlib.suppress(Exception):
        c.hf("kill", run, timeout=60)


def poll(pred, timeout: float, step: float = 0.1):  # type: ignore[no-untyped-def]
    """Seconds until ``pred()`` holds, or None after ``timeout`` (no exception: the caller reports)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(step)
    return None

"""What the Slurm tests share: the experiment the jobs run, the secret, a synchronous engine driver, and a
user's project on the cluster driven through the real CLI (the journey's and the dashboard's)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from helpers_project import cli_env
from polling import pause_after

SECRET = "slurm-s3cret-4e1d9c"
DATA_SAYS = "hello from the laptop's corpus"

OFFLINE_CONFIG = """\
name: lab
slurm:
  login: {host: login.example, user: me}
  workdir: /shared/me/hf
  nodes: 2
"""
"""A Slurm project whose login host is never reached: for what ``plan`` decides before any ssh."""
PROBE_EXPERIMENT = "from higgsfield.experiment import experiment\n\n@experiment('probe')\ndef probe(params):\n    pass\n"


def offline_backend(root: Path) -> Any:
    """The backend of an :data:`OFFLINE_CONFIG` project under ``root`` with the one experiment ``probe``."""
    from higgsfield.control.backends import backend_for
    from higgsfield.control.config import parse_config

    (root / "src").mkdir(exist_ok=True)
    (root / "src" / "probe.py").write_text(PROBE_EXPERIMENT)
    (root / "higgsfield.yml").write_text(OFFLINE_CONFIG)
    return backend_for(parse_config(OFFLINE_CONFIG, root / "higgsfield.yml"))

EXPERIMENT = '''\
"""Ranks of a Slurm run: an all_reduce, a failing rank, a checkpoint that a requeue resumes from."""
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from higgsfield.experiment import experiment, param


@experiment("probe")
@param("sleep", default=0.0)
@param("fail_rank", default=-1)
@param("gate", default="")
@param("steps", default=0)
@param("crash_at", default=-1)
@param("step_s", default=0.0)
def probe(params):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"started rank={rank} world={world} node={os.environ.get('HIGGSFIELD_NODE')} "
          f"secret_len={len(os.environ.get('HF_SLURM_SECRET', ''))} t={time.time():.3f}", flush=True)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    assert t.item() == world * (world + 1) / 2, t.item()
    print(f"all_reduce ok sum={t.item():.0f}", flush=True)
    print(f"mirror={os.environ.get('HIGGSFIELD_CHECKPOINT_MIRROR', '')}", flush=True)
    data = os.environ.get("HIGGSFIELD_DATA_CORPUS", "")
    print(f"data={data} says={(Path(data) / 'hello.txt').read_text().strip() if data else ''}", flush=True)
    if params.fail_rank == rank:
        time.sleep(0.5)
        raise RuntimeError(f"boom on rank {rank}")
    if params.steps:
        from higgsfield.training import StepTimer

        timer = StepTimer()   # rank 0's step metrics: what 'higgsfield metrics' prints and the dashboard plots
        ckpt = Path(os.environ["HIGGSFIELD_CHECKPOINT_DIR"]) / "step"
        start = int(ckpt.read_text()) if ckpt.exists() else 0
        print(f"resumed at step {start}", flush=True)
        for step in range(start, params.steps):
            if step == params.crash_at and start == 0 and rank == 1:  # the first start only
                raise RuntimeError(f"crash at step {step}")
            dist.barrier()
            if rank == 0:
                ckpt.write_text(str(step + 1))
            timer.step(step + 1, 10.0 / (step + 1), 128)
            print(f"step {step + 1}", flush=True)
            time.sleep(params.step_s)
            dist.barrier()
    gate = Path(os.environ["HIGGSFIELD_RUN_DIR"]) / params.gate if params.gate else None
    end = time.time() + params.sleep
    while (gate is not None and not gate.exists()) or time.time() < end:
        time.sleep(0.1)
    dist.barrier()
    print(f"done rank={rank}", flush=True)
'''


class Cluster:
    """A SlurmCluster on the bed, driven from a private event loop (tests stay synchronous)."""

    def __init__(self, settings: Any, known_hosts: Path) -> None:
        from higgsfield.control.backends.slurm import SlurmCluster
        from higgsfield.control.remote.hostkeys import PinnedHosts
        from higgsfield.control.remote.ssh import SSHTransport

        lg = settings.login
        self.loop = asyncio.new_event_loop()
        self.transport = SSHTransport(lg.name, lg.host, user=lg.user, port=lg.port, identity_file=lg.identity_file,
                                      pins=PinnedHosts(known_hosts))
        self.engine = SlurmCluster(self.transport, settings)
        self.settings = settings

    def __call__(self, coro: Any, timeout: float = 120) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def close(self) -> None:
        self.loop.run_until_complete(self.transport.close())
        self.loop.close()


LINE = re.compile(r"^(n\d)/(\d+) \| (.*)$")


class User:
    """A user in their project directory, running ``higgsfield ...`` there (optionally timed)."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd, self.env = cwd, env
        self.timings: dict[str, float] = {}

    def __call__(self, *args: str, timeout: float = 180, ok: bool = True, timed: str | None = None,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=self.cwd, env=env or self.env,
                           capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if timed:
            self.timings[timed] = round(time.monotonic() - t0, 1)
        if ok and r.returncode != 0:
            raise AssertionError(f"higgsfield {' '.join(args)} exited {r.returncode}\nstdout:\n{r.stdout[-4000:]}"
                                 f"\nstderr:\n{r.stderr[-4000:]}")
        return r

    def status(self) -> dict[str, dict[str, Any]]:
        data = json.loads(self("status", "--json").stdout)
        assert data["unreachable"] == {}
        return {r["run"]: r for r in data["runs"]}

    def wait(self, run: str, pred: Any, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            t0 = time.monotonic()
            st = self.status().get(run, {})
            if pred(st):
                return st
            assert time.monotonic() < deadline, f"{run}: {st}"
            pause_after(t0, 1.0)


def by_rank(out: str) -> dict[int, tuple[str, list[str]]]:
    """rank -> (its node, its lines), from ``node/rank | text`` lines."""
    found: dict[int, tuple[str, list[str]]] = {}
    for ln in out.splitlines():
        m = LINE.match(ln)
        if m:
            found.setdefault(int(m.group(2)), (m.group(1), []))[1].append(m.group(3))
    return found


def squeue_names(timeout: float = 30) -> list[str]:
    """The login user's jobs Slurm still runs, once none is left (or after ``timeout``: what is left)."""
    deadline = time.monotonic() + timeout
    while True:
        names = subprocess.run(["squeue", "-h", "-u", "hfnode20", "-o", "%j"], capture_output=True, text=True,
                               timeout=30).stdout.split()
        if not names or time.monotonic() > deadline:
            return names
        time.sleep(0.5)


@contextlib.contextmanager
def make_project(login: Any, root: Path, label: str) -> Iterator[tuple[User, Path]]:
    """A new project in ``root`` whose config names the cluster (nothing set up yet), and its workdir
    (not created yet); the user's jobs are cancelled and the workdir removed afterwards."""
    h, bed = login["host"], login["bed"]
    pw = pwd.getpwnam(h.user)
    workdir = Path(pw.pw_dir) / f"hf-{label}-{uuid.uuid4().hex[:8]}"
    proj = root / "lab"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "slurmprobe.py").write_text(EXPERIMENT)
    (proj / "requirements.txt").write_text("torch==2.13.0\n")   # the CPU wheel on this machine's disk
    (proj / ".gitignore").write_text("env\n.higgsfield/logs/\n.higgsfield/cache/\n")
    (proj / "env").write_text(f"HF_SLURM_SECRET={SECRET}\n")
    (proj / "corpus").mkdir()
    (proj / "corpus" / "hello.txt").write_text(f"{DATA_SAYS}\n")   # a data: entry, sent once to the workdir
    config = {"name": "lab", "secrets": ["HF_SLURM_SECRET"], "nproc_per_node": 2,
              "ssh": {"identity_file": str(bed.client_key), "known_hosts": ".higgsfield/known_hosts"},
              "slurm": {"login": {"host": h.address, "user": h.user, "port": h.port}, "workdir": str(workdir),
                        "partition": "debug", "account": "testlab", "nodes": 2, "time": "5"},
              "checkpoint": {"mirror": f"{workdir}/mirror"}, "data": {"corpus": "./corpus"}}
    (proj / "higgsfield.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = cli_env(root / "home", PYTHONUNBUFFERED="1", COLUMNS="200", GIT_AUTHOR_NAME="u",
                  GIT_AUTHOR_EMAIL="u@example.com", GIT_COMMITTER_NAME="u", GIT_COMMITTER_EMAIL="u@example.com")
    env.pop("CI", None)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "a project on a cluster"]):
        subprocess.run(["git", *args], cwd=proj, env=env, check=True, capture_output=True, timeout=60)
    user = User(proj, env)
    try:
        yield user, workdir
    finally:
        subprocess.run(["scancel", "-u", h.user], capture_output=True, timeout=60)
        if user.timings:
            print(f"\nslurm {label} timings (s):\n" +
                  "\n".join(f"  {k:<34} {v:6.1f}" for k, v in user.timings.items()))
        if not os.environ.get("HF_SLURM_KEEP"):
            shutil.rmtree(workdir, ignore_errors=True)


def print_timings(label: str, user: User) -> None:
    """``user``'s timings so far, under ``label`` (as make_project prints them at its end), then forgotten:
    the next test on the same project prints only its own."""
    if user.timings:
        print(f"\nslurm {label} timings (s):\n" +
              "\n".join(f"  {k:<34} {v:6.1f}" for k, v in user.timings.items()))
    user.timings.clear()


class SharedProject:
    """The session's one cluster project (make_project's), and how far it got.

    The journey must set a project up and deploy it from nothing; the dashboard's tests only need one
    that is set up and deployed, and making it costs a minute (mostly the project environment built in
    the workdir). So the journey takes this project while it is fresh and marks it once its deploy step
    passed; the dashboard's tests then reuse it (``reuse``), put back as they need it, and set up and
    deploy one of their own when the journey did not get that far (or did not run)."""

    def __init__(self, user: User, workdir: Path) -> None:
        self.user, self.workdir = user, workdir
        self.config = (user.cwd / "higgsfield.yml").read_text()   # as made: the journey's last step edits it
        self.claimed = False    # a test began with it: no longer a never-set-up project
        self.deployed = False   # set up and deployed, and that checked

    def claim(self) -> bool:
        """Take the project as a fresh one (never set up); False when a test already had it."""
        fresh, self.claimed = not self.claimed, True
        return fresh

    def mark_deployed(self, user: User) -> None:
        """``user`` set this project up and deployed it (a journey on a project of its own marks nothing)."""
        if user is self.user:
            self.deployed = True

    def reuse(self) -> bool:
        """Whether the project is set up and deployed; if so it is put back as made, less the workdir's
        runs: none of its jobs left in Slurm, higgsfield.yml as made (the journey ends with ``partition:
        nope``), no ``pulled/`` (what the journey's pull brought home)."""
        if not self.deployed:
            return False
        subprocess.run(["scancel", "-u", self.workdir.owner()], capture_output=True, timeout=60)
        left = squeue_names()
        assert left == [], f"jobs left in Slurm by an earlier test on the project: {left}"
        (self.user.cwd / "higgsfield.yml").write_text(self.config)
        shutil.rmtree(self.user.cwd / "pulled", ignore_errors=True)
        return True

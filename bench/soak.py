"""A soak: 4 clients for 10 minutes submitting, killing and following short runs on 3 nodes, mirror and retention on.

    .venv/bin/python bench/soak.py                          # 4 clients, 10 minutes, hfnode30..32
    .venv/bin/python bench/soak.py --minutes 2 --seed 7     # a short one

What is soaked is the real CLI against real test-bed nodes (``higgsfield run --detach |
logs -f | kill | status --json | deploy | prune``), ``runtime: process`` (plain
processes: no container to start per node per run, which on 2 cores is the lighter of
the two, and a run's processes are the node users' own, so an orphan is plainly
visible). The project's one experiment trains a tiny FSDP2 layer on CPU (gloo) for a
few steps, saving a :class:`higgsfield.checkpoint.Checkpoint` after every step
(``keep_last=2``). higgsfield.yml has:

- ``checkpoint.mirror: s3://...``: an S3 API served by moto (``ThreadedMotoServer``) on
  loopback, in this process; the nodes get the keys and the endpoint as the run's
  secrets (``AWS_ACCESS_KEY_ID``..., ``FSSPEC_S3_ENDPOINT_URL``), as a user would. (A
  path mirror cannot serve nodes that are separate users: each node's part is private
  to its user, so no node could see every part and mark a step whole.)
- ``retention: {keep_runs: K, checkpoints: true}``, applied by ``deploy`` (run twice
  during the soak, at 1/3 and 2/3 of it) and by one ``higgsfield prune`` at the end.

Each of ``--clients`` threads loops until the time is up: it submits a run of its own
name (1, 2 or 3 nodes; a few steps), then, chosen by a seeded random draw, follows it
(``logs -f`` to its end), kills it after a random short delay, or leaves it and polls
``status --json`` until it ends. A monitor thread reads ``status --json`` every 15 s,
so every run's last state is known before retention may remove its record.

After the time is up the clients finish what they do, then a drain waits for every
run to end. The record:

- runs submitted, succeeded, killed, failed (each failure's reason), and **lost**: a
  submitted run whose last state is not terminal after the drain, or that no status
  and no prune ever showed. Lost must be 0;
- runs pruned by retention, and succeeded runs whose last step has no ``COMPLETE`` on
  the mirror;
- **orphans**: processes of the node users (or children of this script) still alive
  once every run ended and a grace passed (a supervisor, torchrun, a worker, an
  ``invoker logs``...): nothing of higgsfield stays on a node between runs. Must be 0;
- open file descriptors and RSS of every long-lived process at the start and the end:
  each node's sshd and this script (the clients' side, with moto's S3 server in it);
- each node's state dir (``~/.higgsfield``) and checkpoint dir
  (``~/.cache/higgsfield/<project>``) size, and the mirror's, at the start and the end.

No time is asserted. Exit status 1 when a run was lost or a process orphaned, 2 when the
bench could not run. Figures go to stdout as a Markdown section, and to ``--out FILE`` if given.

Needs root and the test bed (``make testbed``); uses bench hosts hfnode30..32 (stopped at
the end). The first run on this machine builds each node's project venv (torch from the
machine's CPU wheel, s3fs from the package index: about 2 minutes and 1 GB per node);
later runs reuse it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _bed
import psutil

PROJECT = "bench_soak"
EXPERIMENT = "soak"
HOSTS = 3
BUCKET = "soak-mirror"
MIRROR = f"s3://{BUCKET}/ckpt"
KEEP_RUNS = 12
TERMINAL = ("succeeded", "failed", "killed")
SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "FSSPEC_S3_ENDPOINT_URL")
# Beyond torch (the machine's CPU wheel): s3fs for the mirror, at the control side's version (no resolver
# surprises). numpy is not listed: deploy adds it (the first soak found Checkpoint failing without it).
EXTRA_REQUIREMENTS = "s3fs==2026.9.0\n"
MONITOR_EVERY_S = 15.0
ORPHAN_GRACE_S = 45.0
TRAIN = '''\
"""A short soak run: a few steps of a tiny FSDP2 layer on CPU (gloo), a mirrored checkpoint after each."""
import time

from higgsfield.experiment import experiment, param


@experiment("soak", seed=0)
@param("steps", default=4)
@param("width", default=64)
@param("pause", default=0.3)
def soak(params):
    import torch
    from torch.distributed.fsdp import fully_shard

    from higgsfield.checkpoint import Checkpoint
    from higgsfield.training import init_distributed

    init_distributed()
    model = torch.nn.Linear(params.width, params.width, bias=False)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt = Checkpoint(model, opt, every=1, keep_last=2)
    x = torch.randn(8, params.width)
    for step in range(params.steps):
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        ckpt.maybe_save(step)
        if params.rank == 0:
            print(f"step {step} loss {loss.item():.5f}", flush=True)
        time.sleep(params.pause)
    ckpt.wait_uploads(timeout=120)
    if params.rank == 0:
        print(f"soak-done {params.run_name}", flush=True)
'''


# -- the S3 mirror ------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Mirror:
    """moto's S3 server on loopback (in this process) and a client to size it and read its markers."""

    def __init__(self) -> None:
        import logging

        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request on stderr

        self.port = _free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port)
        self.server.start()
        self.secrets = {"AWS_ACCESS_KEY_ID": "soak", "AWS_SECRET_ACCESS_KEY": "soak",
                        "AWS_DEFAULT_REGION": "us-east-1", "FSSPEC_S3_ENDPOINT_URL": f"http://127.0.0.1:{self.port}"}
        self.client = boto3.client("s3", endpoint_url=self.secrets["FSSPEC_S3_ENDPOINT_URL"],
                                   aws_access_key_id="soak", aws_secret_access_key="soak", region_name="us-east-1")
        self.client.create_bucket(Bucket=BUCKET)

    def objects(self) -> list[tuple[str, int]]:
        """Every object (key, size) in the bucket."""
        out: list[tuple[str, int]] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            out += [(o["Key"], int(o["Size"])) for o in page.get("Contents", [])]
        return out

    def complete_steps(self, objects: list[tuple[str, int]]) -> dict[str, set[int]]:
        """run -> the steps with a ``COMPLETE`` marker on the mirror."""
        steps: dict[str, set[int]] = {}
        pat = re.compile(rf"^ckpt/{PROJECT}/{EXPERIMENT}/([^/]+)/step_(\d+)/COMPLETE$")
        for key, _ in objects:
            m = pat.match(key)
            if m:
                steps.setdefault(m.group(1), set()).add(int(m.group(2)))
        return steps

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.server.stop()


# -- what the soak tracks -------------------------------------------------------------------------

@dataclass
class Run:
    """One submitted run and everything the soak saw of it."""

    name: str
    client: int
    nodes: int
    steps: int
    action: str
    submit_rc: int | None = None
    submit_tail: str = ""
    state: str | None = None          # the last state any status showed
    seen: set[str] = field(default_factory=set)  # every state any status showed
    seen_at: float | None = None
    pruned: str | None = None         # the state a prune listing gave when it removed the run
    reason: str | None = None
    error_tail: list[str] = field(default_factory=list)
    follow_rc: int | None = None
    follow_done_line: bool | None = None
    kill_out: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def final(self) -> str | None:
        return self.state if self.state in TERMINAL else (self.pruned or self.state)


class Tracker:
    """The soak's books, shared by the clients, the monitor and retention (one lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: dict[str, Run] = {}
        self.cli: Counter[str] = Counter()       # CLI commands run, by verb
        self.cli_errors: list[str] = []          # non-zero exits that were not the run's own outcome
        self.unreachable: Counter[str] = Counter()
        self.pruned_by_deploy: list[int] = []
        self.deploy_seconds: list[float] = []
        self.node_procs_peak = 0

    def add(self, run: Run) -> None:
        with self.lock:
            self.runs[run.name] = run

    def error(self, msg: str) -> None:
        with self.lock:
            self.cli_errors.append(msg)
        _bed.say(f"error: {msg}")

    def update(self, listing: dict[str, Any]) -> dict[str, str]:
        """Take a ``status --json`` listing: every tracked run's last state; returns run -> state."""
        states: dict[str, str] = {}
        now = time.time()
        with self.lock:
            for node in listing.get("unreachable") or {}:
                self.unreachable[node] += 1
            for r in listing.get("runs") or []:
                name = r.get("run")
                states[name] = r.get("state")
                run = self.runs.get(name)
                if run is None or (run.state in TERMINAL and r.get("state") not in TERMINAL):
                    continue  # a terminal state never goes back; an older reading can't undo it
                run.state, run.seen_at = r.get("state"), now
                run.seen.add(str(r.get("state")))
                run.reason, run.error_tail = r.get("reason"), list(r.get("error_tail") or [])[-3:]
        return states


def hf(project: _bed.Project, tracker: Tracker, *args: str, timeout: float) -> _bed.Result:
    """One CLI command (counted); a timeout is a Result with code 124, never an exception."""
    with tracker.lock:
        tracker.cli[args[0]] += 1
    try:
        return project.hf(*args, timeout=timeout, check=False)
    except _bed.BenchError as e:
        return _bed.Result(project.argv(*args), 124, "", str(e), timeout)


def status(project: _bed.Project, tracker: Tracker) -> dict[str, str] | None:
    """``status --json`` into the tracker; None when it gave no JSON."""
    r = hf(project, tracker, "status", "--json", timeout=180)
    try:
        listing = json.loads(r.out)
    except ValueError:
        tracker.error(f"status --json exited {r.code} without JSON: {r.tail(3)}")
        return None
    return tracker.update(listing)


# -- the clients -------------------------------------------------------------------------------

def submit(project: _bed.Project, tracker: Tracker, run: Run) -> bool:
    """``run --detach``: True when the CLI says the run started."""
    tracker.add(run)
    r = hf(project, tracker, "run", EXPERIMENT, "--run-name", run.name, "--nodes", str(run.nodes), "--detach",
           "-p", f"steps={run.steps}", timeout=300)
    run.submit_rc, run.submit_tail = r.code, r.tail(5)
    if r.code != 0:
        tracker.error(f"run {run.name} --detach exited {r.code}: {r.tail(5)}")
        return False
    return True


def follow(project: _bed.Project, tracker: Tracker, run: Run) -> None:
    """``logs -f`` to the run's end; it must end by itself and, for a run that succeeded, show its last line."""
    r = hf(project, tracker, "logs", run.name, "-f", timeout=600)
    run.follow_rc = r.code
    run.follow_done_line = f"soak-done {run.name}" in r.out
    if r.code != 0:
        tracker.error(f"logs {run.name} -f exited {r.code}: {r.tail(5)}")


def kill(project: _bed.Project, tracker: Tracker, run: Run, delay: float) -> None:
    time.sleep(delay)
    r = hf(project, tracker, "kill", run.name, timeout=180)
    run.kill_out = r.tail(3)
    if r.code != 0:
        tracker.error(f"kill {run.name} exited {r.code}: {r.tail(5)}")


def poll(project: _bed.Project, tracker: Tracker, run: Run, limit_s: float = 600) -> None:
    """``status --json`` every few seconds until the run ended (or ``limit_s``)."""
    t_end = time.monotonic() + limit_s
    while time.monotonic() < t_end:
        states = status(project, tracker)
        if states is not None and states.get(run.name) in TERMINAL:
            return
        time.sleep(4)
    run.notes.append(f"poll: not ended after {limit_s:g}s")


def client(project: _bed.Project, tracker: Tracker, index: int, seed: int, deadline: float) -> None:
    """Submit, then follow, kill or poll, until ``deadline`` (monotonic)."""
    rng = random.Random(seed * 1000 + index)
    n = 0
    while time.monotonic() < deadline:
        n += 1
        action = rng.choices(("follow", "kill", "poll"), weights=(4, 3, 3))[0]
        run = Run(f"soak-c{index}-{n:03d}-{seed}", index, rng.choice((1, 1, 2, 3, 3)), rng.randint(3, 8), action)
        try:
            if submit(project, tracker, run):
                if action == "follow":
                    follow(project, tracker, run)
                elif action == "kill":
                    kill(project, tracker, run, rng.uniform(0.0, 12.0))
                else:
                    poll(project, tracker, run)
        except Exception as e:  # noqa: BLE001 - a client's own bug is reported, the soak goes on
            tracker.error(f"client {index}: {run.name}: {type(e).__name__}: {e}")
        time.sleep(rng.uniform(0.0, 2.0))


def monitor(project: _bed.Project, tracker: Tracker, stop: threading.Event, users: set[str]) -> None:
    """``status --json`` every MONITOR_EVERY_S (every run's last state, before retention removes its record),
    and the peak count of the node users' processes."""
    while not stop.wait(MONITOR_EVERY_S):
        status(project, tracker)
        count = len(node_processes(users))
        with tracker.lock:
            tracker.node_procs_peak = max(tracker.node_procs_peak, count)


RETENTION_LINE = re.compile(r"^\s*(\S+): retention: removed (\d+) run\(s\)", re.M)


def deploy(project: _bed.Project, tracker: Tracker) -> None:
    """``deploy`` (an unchanged commit: nothing shipped, nothing built) then retention: count what it removed."""
    status(project, tracker)  # the last states first: keep_runs removes only older finished runs
    r = hf(project, tracker, "deploy", timeout=600)
    if r.code != 0:
        tracker.error(f"deploy exited {r.code}: {r.tail(8)}")
        return
    removed = sum(int(m.group(2)) for m in RETENTION_LINE.finditer(r.out + r.err))
    with tracker.lock:
        tracker.pruned_by_deploy.append(removed)
        tracker.deploy_seconds.append(r.seconds)
    _bed.say(f"deploy {r.seconds:.1f}s: retention removed {removed} run dir(s) over the nodes")


PRUNED_RUN = re.compile(r"^  run (\S+) \((\w+)\) ", re.M)


def prune(project: _bed.Project, tracker: Tracker) -> int:
    """``higgsfield prune`` (no flags: the retention policy), its listed runs noted; run dirs removed."""
    r = hf(project, tracker, "prune", timeout=600)
    if r.code != 0:
        tracker.error(f"prune exited {r.code}: {r.tail(8)}")
    found = PRUNED_RUN.findall(r.out)
    with tracker.lock:
        for name, state in found:
            run = tracker.runs.get(name)
            if run is not None:
                run.pruned = state
    return len(found)


# -- processes and disk --------------------------------------------------------------------------

@dataclass
class ProcSample:
    """One long-lived process: open fds and RSS."""

    what: str
    pid: int
    fds: int | None
    rss: int | None


def sample(what: str, pid: int) -> ProcSample:
    try:
        p = psutil.Process(pid)
        return ProcSample(what, pid, p.num_fds(), p.memory_info().rss)
    except (psutil.Error, OSError):
        return ProcSample(what, pid, None, None)


def long_lived(hosts: list[Any]) -> dict[str, int]:
    """The processes that live through the whole soak: each node's sshd (listener) and this script."""
    procs = {"soak (clients, moto S3)": os.getpid()}
    for h in hosts:
        with contextlib.suppress(OSError, ValueError):
            procs[f"{h.name} sshd"] = int(Path(h.pidfile).read_text().split()[0])
    return procs


def node_processes(users: set[str]) -> list[psutil.Process]:
    """Every process of the node users except their SSH sessions' own sshd."""
    out = []
    for p in psutil.process_iter(["username", "name"]):
        with contextlib.suppress(psutil.Error):
            if p.info["username"] in users and p.info["name"] != "sshd":
                out.append(p)
    return out


def describe(p: psutil.Process) -> str:
    """user, pid, age, command line and the run it belongs to (from its environment), for an orphan's line."""
    try:
        if p.status() == psutil.STATUS_ZOMBIE:
            return f"{p.username()} pid {p.pid} zombie ({p.name()}), ppid {p.ppid()}"
        env = p.environ()
        cmd = " ".join(p.cmdline())[:160]
        age = time.time() - p.create_time()
        return (f"{p.username()} pid {p.pid} age {age:.0f}s run {env.get('RUN_NAME') or env.get('HIGGSFIELD_RUN_DIR')}"
                f" ppid {p.ppid()}: {cmd}")
    except psutil.Error as e:
        return f"pid {p.pid}: {type(e).__name__} (gone while looked at)"


def orphans(users: set[str], before: set[int], grace_s: float) -> tuple[list[str], list[str]]:
    """Node-user processes (not there ``before``) and children of this script still alive after ``grace_s``
    (polled: what ends within it is fine)."""
    t_end = time.monotonic() + grace_s
    while True:
        nodes = [p for p in node_processes(users) if p.pid not in before]
        mine = [c for c in psutil.Process().children(recursive=True) if c.is_running()]
        if (not nodes and not mine) or time.monotonic() >= t_end:
            return [describe(p) for p in nodes], [describe(p) for p in mine]
        time.sleep(3)


def du(path: Path) -> int:
    """Bytes of the files under ``path`` (lstat; links not followed), 0 when absent."""
    total = 0
    for root, _dirs, files in os.walk(path):  # os.walk follows no directory link
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def count_runs(path: Path) -> int:
    with contextlib.suppress(OSError):
        return sum(1 for p in path.iterdir() if p.is_dir())
    return 0


@dataclass
class Disk:
    """Per node: state dir bytes (all of it, and its runs/ for this project), run dirs, checkpoint bytes; the mirror."""

    state: dict[str, int]
    envs: dict[str, int]
    runs_bytes: dict[str, int]
    run_dirs: dict[str, int]
    ckpt: dict[str, int]
    mirror_objects: int
    mirror_bytes: int


def disk(hosts: list[Any], mirror: S3Mirror) -> Disk:
    objs = mirror.objects()
    home = {h.name: Path(h.home) for h in hosts}
    return Disk(state={n: du(p / ".higgsfield") for n, p in home.items()},
                envs={n: du(p / ".higgsfield" / "envs") for n, p in home.items()},
                runs_bytes={n: du(p / ".higgsfield" / "runs" / PROJECT) for n, p in home.items()},
                run_dirs={n: count_runs(p / ".higgsfield" / "runs" / PROJECT) for n, p in home.items()},
                ckpt={n: du(p / ".cache" / "higgsfield" / PROJECT) for n, p in home.items()},
                mirror_objects=len(objs), mirror_bytes=sum(s for _, s in objs))


# -- the soak --------------------------------------------------------------------------------------

@contextlib.contextmanager
def s3_mirror() -> Iterator[S3Mirror]:
    m = S3Mirror()
    try:
        yield m
    finally:
        m.stop()


def prepare(hosts: list[Any], mirror: S3Mirror) -> tuple[_bed.Project, list[str]]:
    """The project (mirror, retention, secrets), its first setup and deploy (builds each node's venv once)."""
    extra = (f"secrets: [{', '.join(SECRETS)}]\n"
             f"checkpoint:\n  mirror: {MIRROR}\n"
             f"retention:\n  keep_runs: {KEEP_RUNS}\n  checkpoints: true\n")
    project = _bed.Project(PROJECT, hosts, runtime="process", nproc=1, sources={"soak.py": TRAIN},
                           requirements=_bed.requirements_for("process") + EXTRA_REQUIREMENTS, extra_yaml=extra)
    (project.dir / "env").write_text("".join(f"{k}={v}\n" for k, v in mirror.secrets.items()))  # git-ignored
    info = [f"first setup {_bed.first_setup(project).seconds:.0f}s"]
    r = project.hf("deploy", timeout=1800)
    info.append(f"first deploy {r.seconds:.0f}s")
    _bed.say(f"deploy: {r.seconds:.1f}s")
    # One run before the clocks start, so a failure of the setup is no soak figure (and the page cache is warm).
    warm = project.hf("run", EXPERIMENT, "--run-name", f"soak-warmup-{int(time.time())}", "--nodes", str(HOSTS),
                      "-p", "steps=2", timeout=600, check=False)
    if warm.code != 0:
        raise _bed.BenchError(f"the warm-up run on {HOSTS} nodes failed (exit {warm.code}):\n{warm.tail(30)}")
    info.append(f"warm-up run {warm.seconds:.0f}s")
    return project, info


def drain(project: _bed.Project, tracker: Tracker, limit_s: float) -> float:
    """Poll until every tracked run is terminal (or ``limit_s``); the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        status(project, tracker)
        with tracker.lock:
            active = [r.name for r in tracker.runs.values() if r.final not in TERMINAL]
        if not active:
            break
        _bed.say(f"drain: {len(active)} run(s) not ended: {', '.join(active[:6])}")
        time.sleep(10)
    return time.monotonic() - t0


def soak(args: argparse.Namespace) -> dict[str, Any]:
    """Everything: setup, the start figures, the clients, drain, prune, the end figures."""
    with _bed.bench_hosts(HOSTS, docker=False) as hosts, s3_mirror() as mirror:
        users = {h.user for h in hosts}
        project, info = prepare(hosts, mirror)
        try:
            tracker = Tracker()
            procs = long_lived(hosts)
            start = {what: sample(what, pid) for what, pid in procs.items()}
            disk0 = disk(hosts, mirror)
            before = node_processes(users)  # another bench's leftovers: theirs, not this soak's orphans
            for p in before:
                _bed.say(f"present before the soak (not counted): {describe(p)}")
            _bed.say(f"soak: {args.clients} clients for {args.minutes:g} min (seed {args.seed})")
            t0 = time.monotonic()
            deadline = t0 + args.minutes * 60
            stop = threading.Event()
            mon = threading.Thread(target=monitor, args=(project, tracker, stop, users), daemon=True)
            mon.start()
            clients = [threading.Thread(target=client, args=(project, tracker, i, args.seed, deadline), daemon=True)
                       for i in range(args.clients)]
            for c in clients:
                c.start()
            for frac in (1 / 3, 2 / 3):
                time.sleep(max(0.0, t0 + frac * args.minutes * 60 - time.monotonic()))
                deploy(project, tracker)
            for c in clients:
                c.join(timeout=max(60.0, deadline - time.monotonic() + 900))
            stuck = [c.name for c in clients if c.is_alive()]
            soak_s = time.monotonic() - t0
            stop.set()
            mon.join(timeout=240)
            drain_s = drain(project, tracker, args.drain)
            pruned_end = prune(project, tracker)
            status(project, tracker)
            node_orphans, client_orphans = orphans(users, {p.pid for p in before}, ORPHAN_GRACE_S)
            end = {what: sample(what, pid) for what, pid in procs.items()}
            disk1 = disk(hosts, mirror)
            complete = mirror.complete_steps(mirror.objects())
            return {"info": info, "tracker": tracker, "start": start, "end": end, "disk0": disk0, "disk1": disk1,
                    "complete": complete, "node_orphans": node_orphans, "client_orphans": client_orphans,
                    "stuck": stuck, "soak_s": soak_s, "drain_s": drain_s, "pruned_end": pruned_end,
                    "hosts": [h.name for h in hosts], "before": [describe(p) for p in before]}
        finally:
            project.remove()


# -- the record ------------------------------------------------------------------------------------

def mib(n: int | None) -> str:
    """Bytes as MiB, or KiB below one MiB (a run dir is a few KiB)."""
    if n is None:
        return "?"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def report(args: argparse.Namespace, res: dict[str, Any]) -> tuple[str, bool]:
    """The Markdown section and whether the soak passed (no run lost, no process orphaned)."""
    tr: Tracker = res["tracker"]
    runs = list(tr.runs.values())
    submitted = [r for r in runs if r.submit_rc == 0]
    finals = Counter(r.final for r in submitted)
    lost = [r for r in runs if (r.submit_rc == 0 or r.state is not None) and r.final not in TERMINAL]
    failed = [r for r in submitted if r.final == "failed"]
    complete = res["complete"]
    unmirrored = [r for r in submitted if r.final == "succeeded" and r.steps not in complete.get(r.name, set())]
    follows = [r for r in submitted if r.action == "follow"]
    follow_bad = [r for r in follows if r.follow_rc != 0 or (r.final == "succeeded" and not r.follow_done_line)]
    by_nodes = Counter(r.nodes for r in submitted)
    by_action = Counter(r.action for r in submitted)
    orphans_all = res["node_orphans"] + res["client_orphans"]
    ok = not lost and not orphans_all
    try:
        head = subprocess.run(["git", "-C", str(_bed.REPO), "rev-parse", "--short", "HEAD"],  # noqa: S607
                              capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        head = "?"
    cmd = "cd /work/main && timeout 2400 .venv/bin/python bench/soak.py" + (
        f" --minutes {args.minutes:g}" if args.minutes != 10 else "") + (
        f" --seed {args.seed}" if args.seed != 1 else "")
    lines = ["## A soak (issue 21)", "",
             f"`{cmd}` at `{head}`; {args.clients} clients, {args.minutes:g} min, seed {args.seed}, "
             f"nodes {', '.join(res['hosts'])}, runtime process, nproc 1, mirror S3 (moto on loopback), "
             f"retention keep_runs {KEEP_RUNS} + checkpoints; load average at the end {_bed.load_average()}; "
             f"{', '.join(res['info'])}; soak {res['soak_s']:.0f}s, drain {res['drain_s']:.0f}s.", ""]
    rows = [["submitted", len(submitted)],
            ["  by nodes 1 / 2 / 3", " / ".join(str(by_nodes[k]) for k in (1, 2, 3))],
            ["  by action follow / kill / poll", " / ".join(str(by_action[k]) for k in ("follow", "kill", "poll"))],
            ["succeeded", finals["succeeded"]], ["killed", finals["killed"]], ["failed", finals["failed"]],
            ["**lost**", len(lost)],
            ["runs seen queued (by any status)", sum(1 for r in submitted if "queued" in r.seen)],
            ["submissions refused (run --detach exit != 0)", sum(1 for r in runs if r.submit_rc not in (0, None))],
            ["run dirs pruned by retention (deploy x2, node dirs)", " + ".join(map(str, tr.pruned_by_deploy)) or "0"],
            ["runs pruned by the final `prune` (node dirs)", res["pruned_end"]],
            ["succeeded runs without their last step COMPLETE on the mirror", len(unmirrored)],
            ["`logs -f` that failed or missed the last line", f"{len(follow_bad)} of {len(follows)}"],
            ["**orphan processes** (node users / this script's children)",
             f"{len(res['node_orphans'])} / {len(res['client_orphans'])}"],
            ["node users' processes, peak during the soak", tr.node_procs_peak],
            ["CLI commands", ", ".join(f"{k} {v}" for k, v in sorted(tr.cli.items()))],
            ["other CLI errors", len(tr.cli_errors)],
            ["nodes unreachable in a status", sum(tr.unreachable.values())],
            ["clients still running at the end", len(res["stuck"])]]
    lines += [_bed.table(["what", "count"], rows), ""]
    prow = []
    for what, s0 in res["start"].items():
        s1 = res["end"][what]
        prow.append([what, s0.pid, s0.fds, s1.fds, mib(s0.rss), mib(s1.rss)])
    lines += ["Long-lived processes (nothing of higgsfield stays on a node between runs: each run's supervisor "
              "and torchrun end with it):", "",
              _bed.table(["process", "pid", "fds start", "fds end", "RSS start", "RSS end"], prow), ""]
    d0, d1 = res["disk0"], res["disk1"]
    drow = [[n, mib(d0.state[n]), mib(d1.state[n]), mib(d0.state[n] - d0.envs[n]), mib(d1.state[n] - d1.envs[n]),
             f"{d0.run_dirs[n]} ({mib(d0.runs_bytes[n])})",
             f"{d1.run_dirs[n]} ({mib(d1.runs_bytes[n])})", mib(d0.ckpt[n]), mib(d1.ckpt[n])] for n in d0.state]
    drow.append(["mirror (S3)", f"{d0.mirror_objects} objects, {mib(d0.mirror_bytes)}",
                 f"{d1.mirror_objects} objects, {mib(d1.mirror_bytes)}", "", "", "", "", "", ""])
    lines += ["Disk (state dir `~/.higgsfield` whole, and without `envs/`, the project's venv; the project's run "
              "dirs; its checkpoints `~/.cache/higgsfield/bench_soak`):", "",
              _bed.table(["node", "state dir start", "state dir end", "w/o envs start", "w/o envs end",
                          "run dirs start", "run dirs end",
                          "checkpoints start", "checkpoints end"], drow), ""]
    details: list[str] = []
    for r in lost:
        details.append(f"- LOST {r.name} ({r.nodes} node(s), {r.action}): last state {r.state!r}, pruned "
                       f"{r.pruned!r}, submit exit {r.submit_rc}, notes {r.notes}")
    for r in failed:
        details.append(f"- failed {r.name} ({r.nodes} node(s), {r.action}): {r.reason} | "
                       + " | ".join(r.error_tail))
    for r in unmirrored:
        details.append(f"- not on the mirror: {r.name} (step {r.steps}; mirror has "
                       f"{sorted(complete.get(r.name, set()))})")
    for r in follow_bad:
        details.append(f"- logs -f {r.name}: exit {r.follow_rc}, last line seen {r.follow_done_line}, "
                       f"final {r.final}")
    details += [f"- orphan on a node: {o}" for o in res["node_orphans"]]
    details += [f"- orphan child of the soak: {o}" for o in res["client_orphans"]]
    details += [f"- present before the soak (not counted): {o}" for o in res["before"]]
    details += [f"- CLI error: {e[:400]}" for e in tr.cli_errors[:20]]
    if details:
        lines += ["Details:", "", *details, ""]
    lines.append(f"Verdict: {'passed' if ok else 'FAILED'} (lost {len(lost)}, orphans {len(orphans_all)}).")
    return "\n".join(lines) + "\n", ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="how long the clients submit (default 10)")
    ap.add_argument("--clients", type=int, default=4, help="client threads (default 4)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the clients' draws (default 1)")
    ap.add_argument("--drain", type=float, default=600.0, help="seconds the drain waits for every run to end")
    ap.add_argument("--out", type=Path, default=None, help="also write the Markdown section to this file")
    args = ap.parse_args(argv)
    try:
        res = soak(args)
    except _bed.BenchError as e:
        print(f"soak: error: {e}", file=sys.stderr)
        return 2
    text, ok = report(args, res)
    print("\n" + text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

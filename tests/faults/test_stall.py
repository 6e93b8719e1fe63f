"""A hung run is found, explained and handled by the nodes (issue 18). On hosts hfnode8 and hfnode9.

The experiment ``stall`` all-reduces every step and reports its progress
(``higgsfield.training.progress``); one rank can freeze in libc ``sleep`` called through
``ctypes.PyDLL`` (a C call that holds the GIL: faulthandler still answers), while the
others wait in ``all_reduce``. Real torchrun on CPU, real sshd nodes, the process runtime
(and once the Docker runtime):

- on_stall=fail, 2 nodes x 2 ranks: the laptop's ``higgsfield run`` is SIGKILLed after the
  start and the verdict still comes: failed within stall_timeout + 10 s of the last
  progress, naming the frozen rank (node/rank) and its line, the other ranks' group in
  all_reduce, stacks.json on each node; a run queued behind it starts right after and,
  stepping every stall_timeout/3, is never flagged and succeeds;
- on_stall=wait: the record goes ``stalled`` with the diagnosis, then ``running`` again
  when the rank wakes, and the run succeeds;
- on_stall=restart, 2 nodes x 2 ranks: every node's workers are restarted and resume from
  the last checkpoint;
- the Docker runtime, 2 nodes x 2 ranks: the frozen rank is named from inside its container.

The project has ``notify:`` with two destinations, apprise ``json://`` URLs kept as secrets: a
webhook served by this test on loopback, and one nobody listens on. Node 0 sends started,
stalled, failed and succeeded with the laptop gone; the dead destination costs the run nothing
but a line in its launcher log; the webhook's secret path is in no file of the run, no process's
command line and no process's environment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from faults_helpers import Hooks, kill_run_quietly, name, report
from runs_helpers import STATE, Cluster, exe, runs_conftest, wait_for
from testbed import cpu_torch_requirements

pytestmark = [pytest.mark.slow, pytest.mark.sshd]

PROJECT = "hfstall"
HOSTS = (8, 9)
STALL_S = 6.0

STALL = '''\
"""Steps with an all_reduce each; one rank can freeze in a C call that holds the GIL (a hung rank)."""
import ctypes
import os
import time

from higgsfield.experiment import experiment, param


def freeze(seconds):
    """The hang: libc sleep holds the GIL; a signal (the stacks dump) ends it early, so sleep again."""
    libc, end = ctypes.PyDLL(None), time.time() + seconds
    while time.time() < end:
        libc.sleep(max(1, int(end - time.time())))


@experiment("stall", seed=0)
@param("steps", default=20)
@param("step_sleep", default=0.2)
@param("freeze_rank", default=-1)
@param("freeze_step", default=4)
@param("freeze_s", default=3600)
@param("ckpt", default=False)
def stall(params):
    import torch
    import torch.distributed as dist

    from higgsfield.training import init_distributed, progress

    init_distributed()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    start, ckpt = 0, None
    if params.ckpt:
        from higgsfield.checkpoint import Checkpoint

        model = torch.nn.Linear(4, 4)
        ckpt = Checkpoint(model, torch.optim.SGD(model.parameters(), lr=0.1), every=2, keep_last=2)
        start = ckpt.load_latest()
    print(f"attempt {attempt} starts at step {start}", flush=True)
    t = torch.ones(1)
    for step in range(start, params.steps):
        if dist.get_rank() == params.freeze_rank and step == params.freeze_step and attempt == 0:
            print(f"rank {params.freeze_rank} freezes at step {step}", flush=True)
            freeze(params.freeze_s)
        dist.all_reduce(t)
        progress(step)
        print(f"step {step} attempt {attempt}", flush=True)
        if ckpt is not None:
            ckpt.maybe_save(step)
        time.sleep(params.step_sleep)
    if ckpt is not None:
        ckpt.wait()
'''
FREEZE_LINE = "`libc.sleep(max(1, int(end - time.time())))`"


class StallCluster(Cluster):
    hooks: Hooks

    def run_dir(self, i: int, run: str) -> Path:
        return self.home(i) / STATE / "runs" / PROJECT / run

    def record(self, i: int, run: str) -> dict[str, Any]:
        try:
            return dict(json.loads((self.run_dir(i, run) / "run.json").read_text()))
        except (OSError, ValueError):
            return {}

    def last_progress(self, i: int, run: str) -> float:
        """The newest progress any rank of ``run`` reported on node i (its wall time), 0 if none."""
        newest = 0.0
        for p in (self.run_dir(i, run) / "progress").glob("rank*"):
            try:
                newest = max(newest, float(p.read_text().split()[1]))
            except (OSError, IndexError, ValueError):
                continue
        return newest


def _git(d: Path, *args: str) -> None:
    subprocess.run([exe("git"), *args], cwd=d, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


def _configure(c: StallCluster, runtime: str) -> None:
    yml = c.dir / "higgsfield.yml"
    text = yml.read_text().replace("nproc_per_node: 1\n", "nproc_per_node: 2\n")
    text = text.replace("runtime: docker\n", f"runtime: {runtime}\n").replace("runtime: process\n",
                                                                              f"runtime: {runtime}\n")
    yml.write_text(text)
    _git(c.dir, "add", "-A")
    _git(c.dir, "commit", "-qm", f"runtime {runtime}")
    t0 = time.monotonic()
    c.hf("deploy", check=True, timeout=900)
    print(f"deploy ({runtime}): {time.monotonic() - t0:.1f}s")


@pytest.fixture(scope="module")
def stall_cluster(fault_bed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StallCluster]:  # type: ignore[no-untyped-def]
    base = runs_conftest().make_cluster(fault_bed, tmp_path_factory.mktemp("stall") / PROJECT, HOSTS)
    c = StallCluster(base.dir, base.bed, base.nodes)
    (c.dir / "src" / "stall.py").write_text(STALL)
    (c.dir / "requirements.txt").write_text(cpu_torch_requirements(fault_bed.state_dir()))
    c.hooks = Hooks()
    with open(c.dir / "env", "a") as f:   # the destinations are secrets: the git-ignored env file
        f.write(f"NOTIFY_HOOK={c.hooks.url}\nNOTIFY_DEAD=json://127.0.0.1:{c.hooks.dead_port}/x\n")
    with open(c.dir / "higgsfield.yml", "a") as f:
        f.write("notify:\n  to: [NOTIFY_HOOK, NOTIFY_DEAD]\n  events: [started, succeeded, failed, stalled]\n")
    _configure(c, "process")
    yield c
    c.hooks.server.shutdown()


def _states(c: StallCluster, run: str) -> list[str | None]:
    return [c.record(i, run).get("state") for i in HOSTS]


def _ended(c: StallCluster, run: str) -> bool:
    return all(s in ("succeeded", "failed", "killed") for s in _states(c, run))


@pytest.mark.timeout(300)
def test_a_frozen_rank_fails_the_run_named_and_the_queued_run_starts_and_is_never_flagged(
        stall_cluster: StallCluster) -> None:
    c = stall_cluster
    frozen, slow = name("frozen"), name("slow")
    stall = ["--stall-timeout", str(STALL_S), "--on-stall", "fail", "--exclusive"]
    laptop = c.popen("run", "stall", "-p", "freeze_rank=3", "-p", "steps=1000", *stall, "--run-name", frozen)
    try:
        wait_for(lambda: all(s == "running" for s in _states(c, frozen)) or laptop.poll() is not None, 180,
                 f"{frozen} running on both nodes")
        laptop.send_signal(signal.SIGKILL)   # the laptop goes away: the nodes decide alone
        laptop.wait()
        seen = _processes_holding(c.hooks.secret)
        assert seen == [], f"the webhook's secret is in these processes' argv or environment: {seen}"
        c.hf("run", "stall", "-p", "steps=4", "-p", f"step_sleep={STALL_S / 3}", *stall, "--run-name", slow,
             "--detach", check=True, timeout=120)
        wait_for(lambda: _ended(c, frozen), 120, f"{frozen} ended")
        recs = [c.record(i, frozen) for i in HOSTS]
        last = max(c.last_progress(i, frozen) for i in HOSTS)
        assert last > 0, "no rank reported progress"
        for rec in recs:
            assert rec["state"] == "failed", rec
            assert rec["failed_node"] == "hfnode9" and rec["failed_rank"] == 3, rec
            assert rec["reason"].startswith("stalled: "), rec["reason"]
            assert "hfnode9/3 is at stall.py:" in rec["reason"] and FREEZE_LINE in rec["reason"], rec["reason"]
            assert "hfnode8/0, hfnode8/1, hfnode9/2 wait in all_reduce at stall.py:" in rec["reason"], rec["reason"]
            assert rec["stall"]["odd"] == ["hfnode9/3"] and rec["stalled_at"], rec
        detected = max(r["stalled_at"] for r in recs) - last
        ended = max(r["ended_at"] for r in recs) - last
        assert detected <= STALL_S + 10, detected
        for i in HOSTS:
            saved = json.loads((c.run_dir(i, frozen) / "stacks.json").read_text())
            ranks = sorted(r["rank"] for r in saved["ranks"])
            assert ranks == ([0, 1] if i == 8 else [2, 3]), saved
        # the slots went to the queued run at once; stepping every stall_timeout/3, it is never flagged
        wait_for(lambda: _ended(c, slow), 120, f"{slow} ended")
        slow_recs = [c.record(i, slow) for i in HOSTS]
        assert _states(c, slow) == ["succeeded", "succeeded"], slow_recs
        assert all(r.get("stall") is None for r in slow_recs), slow_recs
        freed = min(r["started_at"] for r in slow_recs) - max(r["ended_at"] for r in recs)
        assert freed < 15, freed
        # node 0 told the webhook, laptop gone; the dead destination cost a line in the launcher log
        wait_for(lambda: "succeeded" in c.hooks.events(slow), 30, f"{slow}'s last word")
        assert c.hooks.events(frozen) == ["started", "stalled", "failed"], c.hooks.got
        assert c.hooks.events(slow) == ["started", "succeeded"], c.hooks.got
        failed = c.hooks.body(frozen, "failed")
        assert "node: hfnode9, rank 3" in failed and "stalled: " in failed and "experiment stall" in failed, failed
        launcher = (c.run_dir(8, frozen) / "logs" / "launcher.log").read_text()
        assert "notify: 'failed' not sent to destination 2 of 2 (json://): refused or unreachable" in launcher, \
            launcher[-2000:]
        for i in HOSTS:
            for f in c.run_dir(i, frozen).rglob("*"):
                assert not f.is_file() or c.hooks.secret.encode() not in f.read_bytes(), f
    finally:
        if laptop.poll() is None:
            laptop.kill()
        kill_run_quietly(c, frozen)
        kill_run_quietly(c, slow)
    report("stalled rank", f"detected {detected - STALL_S:.1f}s after the stall timeout ({STALL_S:.0f}s), failed "
           f"{ended:.1f}s after the last progress; the queued run started {freed:.1f}s after")


@pytest.mark.timeout(240)
def test_on_stall_wait_marks_the_run_stalled_then_running_again(stall_cluster: StallCluster) -> None:
    c = stall_cluster
    run = name("waits")
    try:
        c.hf("run", "stall", "-p", "freeze_rank=1", "-p", "freeze_s=14", "-p", "steps=8", "--nodes", "1",
             "--stall-timeout", str(STALL_S), "--on-stall", "wait", "--run-name", run, "--detach",
             check=True, timeout=120)
        wait_for(lambda: c.record(8, run).get("state") == "stalled" or _ended(c, run), 120, f"{run} stalled")
        rec = c.record(8, run)
        assert rec["state"] == "stalled" and rec["stall"]["odd"] == ["hfnode8/1"], rec
        wait_for(lambda: c.record(8, run).get("state") != "stalled", 60, f"{run} running again")
        assert c.record(8, run)["state"] in ("running", "succeeded")
        wait_for(lambda: c.record(8, run).get("state") in ("succeeded", "failed", "killed"), 60, f"{run} ended")
        rec = c.record(8, run)
        assert rec["state"] == "succeeded" and rec["stall"]["odd"] == ["hfnode8/1"], rec
    finally:
        kill_run_quietly(c, run)


@pytest.mark.timeout(240)
def test_on_stall_restart_resumes_every_node_from_the_checkpoint(stall_cluster: StallCluster) -> None:
    c = stall_cluster
    nodes = 2
    run = name("restarts")
    frozen = 2 * nodes - 1     # the last rank of the last node
    hosts = HOSTS[:nodes]
    try:
        c.hf("run", "stall", "-p", f"freeze_rank={frozen}", "-p", "freeze_step=5", "-p", "steps=8", "-p", "ckpt=true",
             "--nodes", str(nodes), "--max-restarts", "1", "--stall-timeout", str(STALL_S), "--on-stall", "restart",
             "--run-name", run, "--detach", check=True, timeout=120)
        wait_for(lambda: all(c.record(i, run).get("state") in ("succeeded", "failed", "killed") for i in hosts), 150,
                 f"{run} ended")
        recs = [c.record(i, run) for i in hosts]
        log = (c.run_dir(8, run) / "logs" / "rank0.log").read_text()
        assert [r["state"] for r in recs] == ["succeeded"] * nodes, (recs, log[-2000:])
        assert all(r["stall"]["odd"] == [f"hfnode{hosts[-1]}/{frozen}"] for r in recs), recs
        assert "attempt 1 starts at step 4" in log or "attempt 1 starts at step 6" in log, log[-2000:]
    finally:
        kill_run_quietly(c, run)


@pytest.mark.docker
@pytest.mark.timeout(400)
def test_the_docker_runtime_names_the_frozen_rank_from_inside_its_container(stall_cluster: StallCluster) -> None:
    """2 nodes x 2 ranks in containers: the host finds each worker by its environment, signals it, reads its dump."""
    c = stall_cluster
    _configure(c, "docker")
    run = name("frozendocker")
    try:
        r = c.hf("run", "stall", "-p", "freeze_rank=3", "-p", "steps=1000", "--nodes", "2",
                 "--stall-timeout", str(STALL_S), "--run-name", run, timeout=240)
        recs = [c.record(i, run) for i in HOSTS]
        assert r.returncode != 0 and [x["state"] for x in recs] == ["failed"] * 2, \
            (recs, r.stdout[-2000:], r.stderr[-2000:])
        rec = recs[0]
        assert rec["failed_node"] == "hfnode9" and rec["failed_rank"] == 3, rec
        assert "hfnode9/3 is at stall.py:" in rec["reason"] and FREEZE_LINE in rec["reason"], rec["reason"]
        assert "hfnode8/0, hfnode8/1, hfnode9/2 wait in all_reduce at stall.py:" in rec["reason"], rec["reason"]
        assert all((c.run_dir(i, run) / "stacks.json").exists() for i in HOSTS)
        wait_for(lambda: "failed" in c.hooks.events(run), 30, f"{run}'s failure sent")
        assert c.hooks.events(run) == ["started", "stalled", "failed"], c.hooks.got
        assert "node: hfnode9, rank 3" in c.hooks.body(run, "failed")
    finally:
        kill_run_quietly(c, run)


def _processes_holding(secret: str) -> list[str]:
    """Every process on this machine whose argv or environment holds ``secret`` (read as root)."""
    found = []
    for p in psutil.process_iter(["pid", "name"]):
        try:
            with open(f"/proc/{p.pid}/cmdline", "rb") as f:
                argv = f.read()
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if p.pid != os.getpid() and (secret.encode() in argv or secret.encode() in env):
            found.append(f"{p.pid} {p.info['name']}")
    return found

"""A hung Slurm run is found inside its own allocation, explained and handled; ``stacks`` works on a live job.

One real job (2 nodes x 2 gloo ranks, submitted through the login node over SSH) is
checked for both, so the slice costs one run: every rank steps and reports its progress
(:func:`higgsfield.training.progress`) until the test opens a gate; before that, the
Slurm session's ``stacks`` takes every rank's stack live (``srun --overlap --jobid`` on
the login node); after it, rank 1 sleeps in ``time.sleep`` while the others wait in
``all_reduce``. The job's batch step (:mod:`higgsfield.node.slurm_stall`) must find the
stall within ``stall_timeout + 10 s`` of the last progress, take and save every rank's
stack, and fail the job with ``stalled: <summary>`` naming the frozen rank ``node/1`` and
its line, the others in ``all_reduce``; ``higgsfield stacks RUN --json`` (the real CLI, against
the bed's login node) names every rank while it runs. One more job: ``on_stall: wait``
(``stalled``, then ``running`` again once the rank goes on). ``on_stall: restart`` (requeued from
the checkpoint, then failed once no requeue is left) shares its job with a lost node's recovery:
test_slurm_recovery.py.

    flock /tmp/hf-testbed.lock .venv/bin/pytest tests/slurm/test_slurm_stall.py -x -q
"""

from __future__ import annotations

import json
import os
import pwd
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from helpers_project import run_cli
from polling import pause_after
from slurm_helpers import Cluster
from test_engine import launcher, run_processes

from higgsfield.contract.codec import encode
from higgsfield.contract.runstatus import status_json

pytestmark = [pytest.mark.slow, pytest.mark.sshd]

STALL_S = 4.0
FROZEN = '''\
"""Ranks that step until a gate opens; then rank ``freeze_rank`` sleeps and the others wait in all_reduce."""
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from higgsfield.experiment import experiment, param
from higgsfield.training import progress


@experiment("frozen")
@param("freeze_rank", default=1)
@param("hold", default=False)
def frozen(params):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    gate = Path(os.environ["HIGGSFIELD_RUN_DIR"]) / "freeze"
    ckpt = Path(os.environ["HIGGSFIELD_CHECKPOINT_DIR"]) / "step"
    step = int(ckpt.read_text()) if rank == 0 and ckpt.exists() else 0
    print(f"resumed at step {step}", flush=True)
    while True:
        step += 1
        t = torch.ones(1)
        dist.all_reduce(t)
        progress(step)
        if rank == 0:
            ckpt.write_text(str(step))
        if rank == params.freeze_rank and gate.exists():
            if params.hold:
                while gate.exists():
                    time.sleep(0.2)  # the held rank
            else:
                time.sleep(3600)  # the frozen rank
        time.sleep(0.2)
'''
SLEEP_LINE = FROZEN.splitlines().index("                time.sleep(3600)  # the frozen rank") + 1
HOLD_LINE = FROZEN.splitlines().index("                    time.sleep(0.2)  # the held rank") + 1


def _install(workdir: Path) -> None:
    """The experiment's module next to the bed's probe, owned by the job's user."""
    path = workdir / "code" / "src" / "slurmstall.py"
    path.write_text(FROZEN)
    pw = pwd.getpwnam("hfnode20")
    os.chown(path, pw.pw_uid, pw.pw_gid)


def _wait(what: str, pred: Any, timeout: float, every: float = 0.2) -> Any:
    """``pred()`` once true, polled at most every ``every`` s (:func:`polling.pause_after`)."""
    deadline = time.monotonic() + timeout
    while True:
        t0 = time.monotonic()
        got = pred()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        pause_after(t0, every)


def _cli_project(root: Path, cluster: Cluster, known_hosts: Path, name: str) -> Path:
    """A project directory whose higgsfield.yml names the bed's cluster (``stacks`` needs no deploy)."""
    lg, st = cluster.settings.login, cluster.settings
    config = {"name": name, "ssh": {"identity_file": lg.identity_file, "known_hosts": str(known_hosts)},
              "slurm": {"login": {"host": lg.host, "user": lg.user, "port": lg.port}, "workdir": st.workdir,
                        "partition": st.partition, "account": st.account, "nodes": 2}}
    proj = root / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "higgsfield.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    return proj


def _last_progress(run_dir: Path) -> float:
    """The newest progress any rank reported (``STEP UNIXTIME`` files)."""
    ats = [float(p.read_text().split()[1]) for p in (run_dir / "progress").glob("rank*")]
    return max(ats)


@pytest.mark.timeout(150)
def test_frozen_rank_fails_the_job_named_and_stacks_live(cluster: Cluster, workdir: Path, known_hosts: Path,
                                                         tmp_path: Path) -> None:
    from higgsfield.control.backends.slurm import template_spec
    from higgsfield.control.backends.slurm.session import SlurmSession

    _install(workdir)
    spec = template_spec(project="slurmproj", experiment="frozen", run=f"frozen-{os.getpid()}", module="slurmstall",
                         code_dir=str(workdir / "code"), params={}, nproc=2, stall_timeout=STALL_S,
                         startup_timeout=120.0, on_stall="fail")
    eng = cluster.engine
    job = cluster(eng.submit(spec))
    run_dir = Path(job.paths.dir)
    session = SlurmSession(SimpleNamespace(name=spec.project), cluster.settings, cluster.transport)  # type: ignore[arg-type]

    # -- live: every rank steps; `stacks` through srun --overlap names all four, on their two nodes ------------
    _wait("every rank's progress", lambda: len(list((run_dir / "progress").glob("rank*"))) == 4, 90)
    status = cluster(eng.status(spec.project, spec.run))
    assert status.state == "running", (status.state, status.reason)
    t0 = time.monotonic()
    live = cluster(session.stacks(status))
    live_s = time.monotonic() - t0
    assert not live.saved and live.unreachable == {}, live
    assert [s.rank for s in live.stacks] == [0, 1, 2, 3], live.stacks
    hosts = sorted({s.node for s in live.stacks})
    assert len(hosts) == 2 and [s.node for s in live.stacks] == [hosts[0]] * 2 + [hosts[1]] * 2
    for s in live.stacks:
        assert s.main is not None and any(f.file.endswith("slurmstall.py") for f in s.main.frames), s
    only = cluster(session.stacks(status, node=hosts[1], rank=3))
    assert [(s.node, s.rank) for s in only.stacks] == [(hosts[1], 3)]
    cli = _cli_project(tmp_path, cluster, known_hosts, spec.project)   # what a user types: `higgsfield stacks`
    out = run_cli(cli, "stacks", spec.run, "--json", home=tmp_path / "home", timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert [(r["node"], r["rank"]) for r in json.loads(out.stdout)] == [(s.node, s.rank) for s in live.stacks]
    assert cluster(eng.saved_stacks(spec.project, spec.run)) is None   # nothing saved before a stall

    # -- the gate: rank 1 sleeps, the others wait in all_reduce; the job finds it, explains it, fails -----------
    (run_dir / "freeze").touch()
    st = _wait("the job failed", lambda: (s := cluster(eng.status(spec.project, spec.run))).state != "running"
               and s, 60)
    seen = time.time()
    last = _last_progress(run_dir)
    record = cluster(eng.record(spec.project, spec.run))
    assert st.state == "failed", (st.state, st.reason)
    assert seen - last <= STALL_S + 10, f"failed {seen - last:.1f} s after the last progress"
    assert record is not None and record["stalled_at"] - last <= STALL_S + 10, (record, last)
    frozen = f"{hosts[0]}/1"
    assert (st.reason or "").startswith("stalled: "), st.reason
    assert frozen in st.reason and f"slurmstall.py:{SLEEP_LINE}" in st.reason, st.reason
    assert "time.sleep(3600)" in st.reason, st.reason
    assert (st.failed_node, st.failed_rank) == (hosts[0], 1), (st.failed_node, st.failed_rank)
    stall = record["stall"]
    assert stall["odd"] == [frozen] and st.stall is not None and encode(st.stall) == stall, (stall, st.stall)
    assert status_json(st)["stall"] == stall   # status --json carries it
    most = stall["groups"][0]
    assert sorted(most["ranks"]) == sorted(f"{s.node}/{s.rank}" for s in live.stacks if s.rank != 1), most
    assert "all_reduce" in most["where"], most

    # -- after: the stacks saved at the stall, as `higgsfield stacks` shows a stalled run --------------------------
    after = cluster(session.stacks(st))
    assert after.saved and [s.rank for s in after.stacks] == [0, 1, 2, 3], after
    frozen_main = next(s for s in after.stacks if s.rank == 1).main
    assert frozen_main is not None and frozen_main.frames[-1].line == SLEEP_LINE, frozen_main
    _wait("the job's processes gone", lambda: not run_processes(str(run_dir)), 15)   # the nodes are free
    print(f"\nslurm stall: live stacks {live_s:.1f} s; failed {seen - last:.1f} s after the last progress "
          f"(stall_timeout {STALL_S:g} s): {st.reason}\n{launcher(cluster, spec)}")


def _submit(cluster: Cluster, workdir: Path, name: str, **kw: Any) -> tuple[Any, Path]:
    from higgsfield.control.backends.slurm import template_spec

    _install(workdir)
    params = {"hold": kw.pop("hold", False)}
    spec = template_spec(project="slurmproj", experiment="frozen", run=f"{name}-{os.getpid()}", module="slurmstall",
                         code_dir=str(workdir / "code"), params=params, nproc=2, stall_timeout=STALL_S,
                         startup_timeout=120.0, **kw)
    job = cluster(cluster.engine.submit(spec))
    return spec, Path(job.paths.dir)


@pytest.mark.timeout(120)
def test_on_stall_wait_shows_stalled_then_running_again(cluster: Cluster, workdir: Path) -> None:
    spec, run_dir = _submit(cluster, workdir, "held", on_stall="wait", hold=True)
    eng = cluster.engine

    def state() -> Any:
        return cluster(eng.status(spec.project, spec.run))

    _wait("every rank's progress", lambda: len(list((run_dir / "progress").glob("rank*"))) == 4, 90)
    (run_dir / "freeze").touch()
    st = _wait("stalled", lambda: (s := state()).state == "stalled" and s, STALL_S + 15)
    assert (st.reason or "").startswith("stalled: ") and f"slurmstall.py:{HOLD_LINE}" in st.reason, st.reason
    assert "/1 is at" in st.reason and "all_reduce" in st.reason, st.reason
    assert st.active and cluster(eng.saved_stacks(spec.project, spec.run)), "the stacks at the stall are kept"
    (run_dir / "freeze").unlink()
    st = _wait("running again", lambda: (s := state()).state == "running" and s, 15)
    record = cluster(eng.record(spec.project, spec.run))
    assert record and record["state"] == "running" and record["stall"]["odd"], record   # the diagnosis stays
    cluster(eng.cancel(spec.project, spec.run))
    assert state().state == "killed"

"""The Slurm engine on a real cluster: submit through the login node over SSH, query, cancel, fail, requeue.

Each test submits real batch jobs (2 nodes x 2 gloo processes of torch) as hfnode20 and
checks what a user would: the run states through the engine's mapping, the per-rank logs
through ``higgsfield invoker logs`` on the login node, Slurm's own view (squeue, scontrol),
and the processes on the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from polling import pause_after
from slurm_helpers import SECRET, Cluster

from higgsfield.contract.slurmjob import SlurmJob, decode_job, decode_request

pytestmark = [pytest.mark.slow, pytest.mark.sshd]
_seq = iter(range(1, 10_000))


def spec(cluster: Cluster, workdir: Path, name: str, **params: Any) -> Any:
    from higgsfield.control.backends.slurm import template_spec

    restarts = int(params.pop("max_restarts", 0))
    recoveries = {"max_recoveries": int(params.pop("max_recoveries"))} if "max_recoveries" in params else {}
    return template_spec(project="slurmproj", experiment="probe", run=f"{name}-{os.getpid()}-{next(_seq)}",
                         module="slurmprobe", code_dir=str(workdir / "code"), params=params, nproc=2,
                         max_restarts=restarts, **recoveries)


def wait_state(cluster: Cluster, s: Any, states: set[str], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        t0 = time.monotonic()
        st = cluster(cluster.engine.status(s.project, s.run))
        if st.state in states:
            return st
        if time.monotonic() > deadline:
            raise AssertionError(f"run {s.run} is {st.state} ({st.reason}), not {states}\n{launcher(cluster, s)}")
        pause_after(t0, 0.3)


def launcher(cluster: Cluster, s: Any) -> str:
    """The end of the job's output (the batch step, srun, every torchrun): for a failed assertion."""
    path = Path(cluster.engine.paths(s.project, s.run).launcher_log)
    return path.read_text()[-4000:] if path.exists() else "(no launcher log)"


def wait_file(path: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


def logs(cluster: Cluster, s: Any) -> list[tuple[int, str]]:
    """What ``higgsfield invoker logs -f`` prints on the login node, unchanged, for this (finished) run.

    ``-f`` so the ranks' tees have drained (a worker's tee can write its last lines just
    after the worker, and so the run, ended); on a finished run it returns once they have.
    """
    async def collect() -> list[tuple[int, str]]:
        return [x async for x in cluster.engine.logs(s.project, s.run, follow=True)]
    return cluster(collect())


def squeue_ids() -> set[str]:
    return set(subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                              timeout=30).stdout.split())


def run_processes(run_dir: str) -> list[int]:
    """Processes anywhere on this machine (every Slurm node is on it) of this run."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = (p / "environ").read_bytes()
            cmd = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if f"HIGGSFIELD_RUN_DIR={run_dir}".encode() in env.split(b"\0") or run_dir.encode() in cmd:
            found.append(int(p.name))
    return found


@pytest.mark.timeout(240)
def test_two_nodes_all_reduce_logs_and_success(cluster: Cluster, workdir: Path) -> None:
    s = spec(cluster, workdir, "allreduce")
    job = cluster(cluster.engine.submit(s, {"HF_SLURM_SECRET": SECRET}))
    assert job.job_id.isdigit()
    assert decode_job(json.loads(Path(job.paths.job).read_text())).job_id == job.job_id   # kept, typed
    req = decode_request(json.loads(Path(job.paths.request).read_text()))   # what the job read
    assert req.spec == s and req.secret_names == ["HF_SLURM_SECRET"] and req.checkpoint_dir == job.paths.checkpoints
    st = wait_state(cluster, s, {"succeeded", "failed", "killed"})
    assert st.state == "succeeded", (st.reason, st.error_tail, launcher(cluster, s))
    assert st.exit_code == 0 and len(st.nodes) == 2, st
    lines = logs(cluster, s)
    by_rank: dict[int, list[str]] = {}
    for rank, text in lines:
        by_rank.setdefault(rank, []).append(text)
    assert sorted(r for r in by_rank if r >= 0) == [0, 1, 2, 3], sorted(by_rank)
    for r in range(4):
        assert "all_reduce ok sum=10" in by_rank[r], by_rank[r]
        started = [t for t in by_rank[r] if t.startswith("started")]
        assert len(started) == 1 and f"secret_len={len(SECRET)}" in started[0], by_rank[r]
    nodes = {t.split("node=")[1].split()[0] for r in range(4) for t in by_rank[r] if t.startswith("started")}
    assert len(nodes) == 2, nodes
    # accounting (sacct) says the same as squeue; so does squeue alone, and the record once the job is purged
    assert cluster(cluster.engine.accounting())
    acct = cluster(cluster.engine.sacct([job.job_id]))[job.job_id]
    assert (acct.state, acct.exit_code, acct.nodes) == ("COMPLETED", 0, tuple(st.nodes))
    cluster.engine._accounting = False
    assert cluster(cluster.engine.status(s.project, s.run)).state == "succeeded"
    from higgsfield.control.backends.slurm.runstatus import merge

    record = cluster(cluster.engine.record(s.project, s.run))
    assert merge(SlurmJob(job.job_id), None, record).state == "succeeded"   # the job long purged


@pytest.mark.timeout(300)
def test_pending_while_nodes_held_then_cancel_both(cluster: Cluster, workdir: Path) -> None:
    # a job that cannot recover from a lost node: Slurm never starts it again by itself, so the batch step
    # deletes its secrets carrier for good (one that can keeps it, 0600, for that start: test_slurm_recovery)
    first = spec(cluster, workdir, "holder", gate="release", max_recoveries=0)
    a = cluster(cluster.engine.submit(first, {"HF_SLURM_SECRET": SECRET}))
    st = wait_state(cluster, first, {"running"})
    wait_file(Path(a.paths.dir) / "logs" / "rank3.log")
    second = spec(cluster, workdir, "waiter")
    b = cluster(cluster.engine.submit(second, {"HF_SLURM_SECRET": SECRET}))
    deadline = time.monotonic() + 30
    while True:   # Slurm says why it waits: Resources (2 + 2 nodes asked of 3)
        t0 = time.monotonic()
        st = cluster(cluster.engine.status(second.project, second.run))
        if st.state == "queued" and st.reason in ("Resources", "Priority"):
            break
        assert time.monotonic() < deadline, (st.state, st.reason)
        pause_after(t0, 0.3)
    assert cluster(cluster.engine.status(first.project, first.run)).state == "running"

    # secrets: in no file of the workdir (but the pending run's own 0600 carrier), not in the script,
    # not in scontrol show job, not in any argv
    for path in Path(workdir).rglob("*"):
        if path.is_file() and not path.is_symlink() and "venv" not in path.parts and str(path) != b.paths.secrets:
            assert SECRET.encode() not in path.read_bytes(), path
    assert not Path(a.paths.secrets).exists()                         # taken and deleted at job start
    assert Path(b.paths.secrets).stat().st_mode & 0o777 == 0o600      # waiting, private, until b starts
    shown = subprocess.run(["scontrol", "show", "job", "-dd", a.job_id], capture_output=True, text=True,
                           timeout=30).stdout
    assert a.job_id in shown and SECRET not in shown
    script = subprocess.run(["scontrol", "write", "batch_script", a.job_id, "-"], capture_output=True,
                            text=True, timeout=30).stdout
    assert "#SBATCH --nodes=2" in script and SECRET not in script
    for pid in run_processes(a.paths.dir):
        assert SECRET.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()

    cluster(cluster.engine.cancel(second.project, second.run))            # a pending job
    assert b.job_id not in squeue_ids()
    assert not Path(b.paths.secrets).exists()
    assert cluster(cluster.engine.status(second.project, second.run)).state == "killed"

    assert run_processes(a.paths.dir)
    cluster(cluster.engine.cancel(first.project, first.run))              # a running job
    assert a.job_id not in squeue_ids()
    st = cluster(cluster.engine.status(first.project, first.run))
    assert st.state == "killed", (st.state, st.reason)
    deadline = time.monotonic() + 15
    while run_processes(a.paths.dir):
        assert time.monotonic() < deadline, f"left behind: {run_processes(a.paths.dir)}"
        time.sleep(0.2)
    record = cluster(cluster.engine.record(first.project, first.run))
    assert record and record["state"] == "killed", record


@pytest.mark.timeout(240)
def test_failing_rank_fails_the_job_naming_node_and_rank(cluster: Cluster, workdir: Path) -> None:
    s = spec(cluster, workdir, "failing", fail_rank=3)
    cluster(cluster.engine.submit(s))
    st = wait_state(cluster, s, {"succeeded", "failed", "killed"})
    assert st.state == "failed", st
    assert st.failed_rank == 3, (st.failed_rank, st.reason)
    hosts = sorted(st.nodes)
    assert st.failed_node == hosts[1], (st.failed_node, hosts)   # ranks 2, 3 on the second host by name
    assert "boom on rank 3" in (st.reason or ""), st.reason
    assert st.failed_node in (st.reason or "")
    assert any("boom on rank 3" in ln for ln in st.error_tail), st.error_tail


@pytest.mark.timeout(300)
def test_requeue_resumes_from_the_checkpoint(cluster: Cluster, workdir: Path) -> None:
    s = spec(cluster, workdir, "requeue", steps=6, crash_at=3, max_restarts=1)
    job = cluster(cluster.engine.submit(s, {"HF_SLURM_SECRET": SECRET}))
    script = Path(job.paths.script).read_text()
    assert "#SBATCH --requeue" in script and "#SBATCH --open-mode=append" in script
    st = wait_state(cluster, s, {"succeeded", "failed", "killed"}, timeout=240)
    assert st.state == "succeeded", (st.state, st.reason, st.error_tail)
    text = [t for r, t in logs(cluster, s) if r == 0]
    assert "resumed at step 0" in text and "resumed at step 3" in text, text
    assert Path(job.paths.checkpoints, "step").read_text() == "6"
    # the secret reached the second start too (put back for our own requeue, deleted again)
    assert sum(f"secret_len={len(SECRET)}" in t for t in text) == 2, text
    assert not Path(job.paths.secrets).exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("field", "value", "words"), [("partition", "nope", "Invalid partition"),
                                                       ("account", "nolab", "Invalid account")])
def test_bad_partition_or_account_is_one_clear_line(settings_data: dict[str, Any], known_hosts: Path,
                                                    workdir: Path, field: str, value: str, words: str) -> None:
    from higgsfield.control.backends.slurm import SlurmRefused
    from higgsfield.control.config.slurm import SlurmConfig

    c = Cluster(SlurmConfig.model_validate({**settings_data, field: value}), known_hosts)
    try:
        s = spec(c, workdir, f"bad{field}")
        with pytest.raises(SlurmRefused) as e:
            c(c.engine.submit(s, {"HF_SLURM_SECRET": SECRET}))
        msg = str(e.value)
        assert "\n" not in msg and words in msg and f"{field} '{value}'" in msg, msg
        assert e.value.exit_code == 2
        assert not Path(c.engine.paths(s.project, s.run).secrets).exists()
    finally:
        c.close()

"""The node side keeps a multi-node run together: fail fast, gang admission, clean exits, privacy.

3-node Docker runs on the shared test bed (hfnode0..2), with the laptop gone where it matters
(``--detach``, nothing follows the run): whatever ends one node's part non-zero (a rank's
exception, a SIGABRT, a SIGKILL as from the OOM killer, torchrun itself dying) fails the run on
every node and stops the survivors within 10 s, each record naming the first failing node and
rank with the last lines of its error. ``higgsfield run`` returns promptly with the failure's
exit code. Two ``--exclusive`` runs submitted at once both finish, one after the other, on every
node in the same order. Ten 3-node runs in a row end without a single abort at exit.

    pytest -m "sshd and docker" tests/runs/test_fail_fast.py
"""

from __future__ import annotations

import json
import os
import signal
import stat
import time
import uuid

import pytest
from runs_helpers import Cluster, containers, node_states, record, run_processes, status, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.sshd, pytest.mark.docker]

NODES = range(3)
DEADLINE_S = 10.0


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _stopped_everywhere(c: Cluster, run: str) -> bool:
    return all(record(c, i, run).get("state") in ("failed", "killed", "succeeded")
               and not run_processes(c.run_dir(i, run)) for i in NODES)


def _poll(pred, timeout: float) -> float | None:  # type: ignore[no-untyped-def]
    """The wall time at which ``pred()`` first held (polled every 0.1 s), None after ``timeout``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return time.time()
        time.sleep(0.1)
    return None


def _error_time(c: Cluster, i: int, run: str, rank: int) -> float:
    path = c.run_dir(i, run) / "logs" / f"rank{rank}.error.json"
    wait_for(path.exists, 300, f"rank {rank}'s error file")
    return float(json.loads(path.read_text())["time"])


def _all_failed_naming(c: Cluster, run: str, node: str, rank: int | None) -> list[dict]:  # type: ignore[type-arg]
    recs = [record(c, i, run) for i in NODES]
    for i, rec in enumerate(recs):
        assert rec["state"] == "failed", (i, rec)
        assert (rec["failed_node"], rec["failed_rank"]) == (node, rank), (i, rec)
    return recs


@pytest.mark.timeout(600)
@pytest.mark.parametrize("how,words", [("raise", "RuntimeError: probe failure on rank 2"),
                                       ("abort", "was killed by SIGABRT")])
def test_a_failing_rank_stops_every_node_within_10s_with_the_laptop_gone(deployed: Cluster, how: str,
                                                                          words: str) -> None:
    c = deployed
    run = _name(f"ff-{how}")
    c.hf("run", "probe", "-p", "sleep=600", "-p", "fail_rank=2", "-p", "fail_after=3", "-p", f"how={how}",
         "--run-name", run, "--detach", check=True, timeout=300)
    failed_at = _error_time(c, 2, run, 2)
    done = _poll(lambda: _stopped_everywhere(c, run), 60)
    assert done is not None, {i: record(c, i, run).get("state") for i in NODES}
    took = done - failed_at
    print(f"\nrank 2 {how}: every node failed and stopped {took:.1f}s after the failure")
    assert took < DEADLINE_S, f"the survivors stopped {took:.1f}s after rank 2 failed"
    recs = _all_failed_naming(c, run, "hfnode2", 2)
    assert all(words in rec["reason"] for rec in recs), recs[0]["reason"]
    assert any(f"rank 2 fails now ({how})" in line for line in recs[0]["error_tail"]), recs[0]["error_tail"]
    assert containers(run) == []
    # status names the first failure and shows the last lines of its error
    st = status(c)[run]
    assert (st["state"], st["failed_node"], st["failed_rank"]) == ("failed", "hfnode2", 2)
    out = c.hf("status", timeout=120).stdout
    assert f"{run}: first failure on hfnode2 rank 2:" in out and f"| rank 2 fails now ({how})" in out


@pytest.mark.timeout(600)
def test_run_returns_promptly_with_the_failure_when_a_worker_is_sigkilled(deployed: Cluster) -> None:
    c = deployed
    run = _name("ff-kill9")
    r = c.hf("run", "probe", "-p", "sleep=600", "-p", "fail_rank=1", "-p", "fail_after=3", "-p", "how=kill9",
             "--run-name", run, timeout=300)
    returned = time.time()
    failed_at = _error_time(c, 1, run, 1)   # written by the rank's tee the moment it died
    print(f"\nrank 1 SIGKILLed: 'higgsfield run' returned {returned - failed_at:.1f}s later, exit {r.returncode}")
    assert r.returncode == 1, r.stderr[-2000:]   # torchrun's exit code on the failing node
    assert returned - failed_at < DEADLINE_S + 5, "higgsfield run did not return promptly"
    assert f"run {run} failed (first failure: node hfnode1, rank 1)" in r.stderr, r.stderr[-2000:]
    assert "rank 1 was killed by SIGKILL (out of memory?)" in r.stderr
    assert "| rank 1 fails now (kill9)" in r.stderr
    _all_failed_naming(c, run, "hfnode1", 1)
    assert not any(run_processes(c.run_dir(i, run)) for i in NODES) and containers(run) == []


@pytest.mark.timeout(600)
def test_torchrun_dying_on_one_node_stops_the_others(deployed: Cluster) -> None:
    c = deployed
    run = _name("ff-torchrun")
    c.hf("run", "probe", "-p", "sleep=600", "--run-name", run, "--detach", check=True, timeout=300)
    logs = [c.run_dir(i, run) / "logs" / f"rank{i}.log" for i in NODES]
    wait_for(lambda: all(p.exists() and "secret_len" in p.read_text() for p in logs), 300, "every rank to start")

    def torchrun_pid() -> int | None:
        for pid in run_processes(c.run_dir(1, run)):
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if b"torch.distributed.run" in cmd and b"higgsfield.node.runtime.launch" not in cmd:
                return pid
        return None

    pid = wait_for(torchrun_pid, 30, "torchrun on hfnode1")
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    done = _poll(lambda: _stopped_everywhere(c, run), 60)
    assert done is not None, {i: record(c, i, run).get("state") for i in NODES}
    print(f"\ntorchrun SIGKILLed on hfnode1: every node failed and stopped {done - killed:.1f}s later")
    assert done - killed < DEADLINE_S
    recs = _all_failed_naming(c, run, "hfnode1", None)   # the node's torchrun failed, not one of its ranks
    assert "torchrun was killed by SIGKILL" in recs[0]["reason"], recs[0]["reason"]
    assert containers(run) == []


@pytest.mark.timeout(600)
def test_two_exclusive_runs_submitted_at_once_both_finish_one_after_the_other(deployed: Cluster) -> None:
    c = deployed
    a, b = _name("gang-a"), _name("gang-b")
    procs = [c.popen("run", "probe", "-p", "sleep=3", "--exclusive", "--run-name", x) for x in (a, b)]
    outs = [p.communicate(timeout=400) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    st = status(c)
    assert st[a]["state"] == st[b]["state"] == "succeeded"
    first, second = sorted((a, b), key=lambda x: st[x]["started_at"])
    # gang admission: the second started nowhere before the first had ended everywhere
    assert st[second]["started_at"] >= st[first]["ended_at"], (st[first], st[second])
    for i in NODES:
        f, s = record(c, i, first), record(c, i, second)
        assert s["started_at"] >= f["ended_at"], f"hfnode{i} started {second} before {first} ended"
        assert f["master_port"] and s["master_port"]
    print(f"\ntwo exclusive runs submitted at once: {first} then {second}, "
          f"{st[second]['started_at'] - st[first]['ended_at']:.1f}s apart")


@pytest.mark.timeout(900)
def test_four_three_node_runs_end_without_an_abort_and_leave_private_files(deployed: Cluster) -> None:
    """Each run's end is a chance for gloo to abort a rank at teardown; four runs are
    two waves of the queue, the second starting on the same nodes as the first ends
    (twelve node parts ending, each checked; a third wave cost half a minute more)."""
    c = deployed
    runs = [_name(f"clean{k}") for k in range(4)]
    for run in runs:   # queued two at a time per node (CPU slots); every one regression, 3 steps
        c.hf("run", "regression", "-p", "steps=3", "--run-name", run, "--detach", check=True, timeout=300)
    def ended() -> bool:   # the nodes' records, not `status` (a CLI on 3 nodes, runs_helpers.node_states)
        return all(len(s := node_states(c, r)) == len(NODES) and set(s) <= {"succeeded", "failed"} for r in runs)

    wait_for(ended, 600, "the four runs to end", poll=0.5)
    st = status(c)
    aborts = []
    for run in runs:
        for i in NODES:
            logs = c.run_dir(i, run) / "logs"
            text = (logs / f"rank{i}.log").read_text() + (logs / "launcher.log").read_text()
            if "terminate called" in text or "SIGABRT" in text or not (logs / f"rank{i}.done").exists():
                aborts.append((run, i))
    assert aborts == [] and all(st[r]["state"] == "succeeded" for r in runs), (aborts, {r: st[r] for r in runs})
    # the node's records, specs, logs and indexes are the node user's alone
    for i in NODES:
        state = c.home(i) / ".hfrt"
        paths = [state, state / "queue.json", *(c.run_dir(i, runs[0]).rglob("*")), c.run_dir(i, runs[0])]
        loose = [f"{p} {stat.filemode(p.stat().st_mode)}" for p in paths
                 if p.exists() and p.stat().st_mode & 0o077]
        assert loose == [], loose

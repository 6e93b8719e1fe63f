"""A kill while queued, and the control machine disconnecting mid-run. On hosts hfnode8..10.

- kill while queued: a 3-node ``--exclusive`` run holds every node; a second one waits
  (``queued`` on every node). Killing it is quick, leaves every node's queue, and it never
  starts once the first run ends. (tests/runs/test_multinode.py::test_queue_same_slots_wait_fifo_and_disjoint_slots_share
  kills a queued run on the shared hosts too.)
- the control machine goes away mid-run: ``higgsfield run`` (attached) loses its SSH
  connection to one node: the run goes on (the laptop cannot tell its own network from a dead
  node; the nodes decide). ``higgsfield run`` is SIGKILLed; ``higgsfield logs -f`` is started,
  loses its connection, and is SIGKILLed too. The run goes on regardless, and a last
  ``logs -f`` re-attaches and prints every line of every rank exactly once, in order, until
  the run ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from faults_helpers import (
    INDICES,
    FaultCluster,
    containers,
    kill_run_quietly,
    lines_by_rank,
    log_has,
    name,
    poll,
    report,
    signal_all,
    sshd_sessions_running,
)
from runs_helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.sshd, pytest.mark.docker]


def _queue(i: int) -> list[str]:
    path = Path(f"/home/hfnode{i}/.hfrt/queue.json")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    entries = data.get("entries", data) if isinstance(data, dict) else data
    return [e["run"] for e in entries]


@pytest.mark.timeout(600)
def test_a_run_killed_while_queued_leaves_every_queue_and_never_starts(faults: FaultCluster) -> None:
    c = faults
    first, second = name("holds"), name("queued")
    try:
        c.hf("run", "regression", "-p", "steps=100000", "-p", "step_sleep=0.2", "--exclusive", "--run-name", first,
             "--detach", check=True, timeout=300)
        c.hf("run", "regression", "-p", "steps=5", "--exclusive", "--run-name", second, "--detach", check=True,
             timeout=300)
        wait_for(lambda: all(c.record(i, first).get("state") == "running" for i in INDICES), 300, f"{first} running")
        wait_for(lambda: all(c.record(i, second).get("state") == "queued" for i in INDICES), 60, f"{second} queued")
        assert all(second in _queue(i) for i in INDICES), {i: _queue(i) for i in INDICES}
        t0 = time.monotonic()
        r = c.hf("kill", second, timeout=60)
        took = time.monotonic() - t0
        assert r.returncode == 0 and f"{second}: killed" in r.stdout, r.stdout + r.stderr
        assert all(c.record(i, second).get("state") == "killed" for i in INDICES), \
            {i: c.record(i, second).get("state") for i in INDICES}
        assert not any(second in _queue(i) for i in INDICES), {i: _queue(i) for i in INDICES}
        assert all(c.record(i, first).get("state") == "running" for i in INDICES)  # the running one is untouched
        # the slots free up: the killed run must not start
        c.hf("kill", first, check=True, timeout=60)
        wait_for(lambda: all(c.record(i, first).get("state") == "killed" for i in INDICES), 60, f"{first} killed")
        time.sleep(5)
        for i in INDICES:
            assert c.record(i, second).get("state") == "killed"
            assert not list((c.run_dir(i, second) / "logs").glob("rank*.log")), f"{second} started on hfnode{i}"
        assert containers(second) == []
        st = c.status()[second]
        assert st["state"] == "killed" and st["started_at"] is None, st
    finally:
        kill_run_quietly(c, first)
        kill_run_quietly(c, second)
    report("kill while queued", f"{took:.1f}s from 'higgsfield kill' to killed and out of the queue on 3 nodes; "
           "it never started when the slots freed")


class _Reader:
    """Collects a process's stdout lines in a thread, with the time each arrived."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.first_at: float | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for ln in self.proc.stdout:
            if self.first_at is None:
                self.first_at = time.monotonic()
            self.lines.append(ln.rstrip("\n"))


def _steps(lines: list[str]) -> dict[tuple[str, str], list[int]]:
    """(node, rank) -> the step numbers its lines carry, in order; the launcher's own lines left out."""
    out = {}
    for key, texts in lines_by_rank("\n".join(lines)).items():
        if key[1] != "launcher":
            out[key] = [int(t.split()[1]) for t in texts if t.startswith("step ")]
    return out


def _wait_streamed(seen: _Reader, timeout: float = 300) -> None:
    """Every rank's first 10 steps reached the attached process's stdout (its output shown if not)."""
    def ok() -> bool:
        got = _steps(seen.lines)
        return len(got) == 3 and all(len(v) >= 10 for v in got.values())

    if poll(ok, timeout) is None:
        err = seen.proc.stderr.read() if seen.proc.poll() is not None and seen.proc.stderr else "(still running)"
        raise AssertionError(f"{timeout:.0f}s without every rank's first 10 steps on stdout; last lines: "
                             f"{seen.lines[-8:]}; stderr: {err[-1500:]}")


def _drop_connection(i: int, *needles: str) -> list[int]:
    """Kill the sshd processes of node i serving the command with these needles: its SSH connection drops."""
    pids = wait_for(lambda: sshd_sessions_running(i, *needles), 60, f"the SSH session on hfnode{i}")
    signal_all(pids, signal.SIGKILL)
    return list(pids)


def _going_on(c: FaultCluster, run: str, watch: float = 3.0) -> bool:
    """Running on every node by its record, and every rank's log still grows (a stopped run's does not)."""
    before = {i: c.rank_log(i, run).read_text().count("\nstep ") for i in INDICES}
    time.sleep(watch)
    return all(c.record(i, run).get("state") == "running" for i in INDICES) and \
        all(c.rank_log(i, run).read_text().count("\nstep ") > before[i] for i in INDICES)


def _popen(c: FaultCluster, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "higgsfield", *args], cwd=c.dir, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.mark.timeout(600)
def test_a_dropped_connection_of_the_attached_run_does_not_stop_the_run(faults: FaultCluster) -> None:
    """The laptop cannot tell a node that died from its own network dropping: the nodes decide, the run goes on."""
    c = faults
    run = name("drop")
    attached = _popen(c, "run", "regression", "-p", "steps=100000", "-p", "step_sleep=0.1", "--run-name", run)
    try:
        seen = _Reader(attached)
        _wait_streamed(seen)
        _drop_connection(9, "logs", run)
        t0 = time.monotonic()
        went_on = _going_on(c, run, watch=8.0)
        states = [c.record(i, run).get("state") for i in INDICES]
        report("control side's connection to a node dropped",
               "the run went on" if went_on else
               f"the run was stopped by the control side ({states}, {c.record(8, run).get('reason')}) "
               f"within {time.monotonic() - t0:.0f}s")
        assert went_on, f"dropping 'higgsfield run''s connection to hfnode9 stopped the run: {states}, " \
                        f"reason {c.record(8, run).get('reason')!r}"
    finally:
        if attached.poll() is None:
            attached.kill()
        kill_run_quietly(c, run)


@pytest.mark.timeout(600)
def test_the_control_machine_going_away_mid_run_loses_no_log_line(faults: FaultCluster) -> None:
    c = faults
    run = name("away")
    steps = 300   # 0.1 s each: about 30 s of run, long enough for the faults below
    attached = _popen(c, "run", "regression", "-p", f"steps={steps}", "-p", "step_sleep=0.1", "--run-name", run)
    follower: subprocess.Popen[str] | None = None
    try:
        seen = _Reader(attached)
        _wait_streamed(seen)
        # 1. the laptop is gone: 'higgsfield run' dies without a word (its connections close)
        attached.kill()
        attached.wait(30)
        assert _going_on(c, run), f"the run stopped with its laptop: {[c.record(i, run).get('state') for i in INDICES]}"
        # 2. 'logs -f' re-attaches, loses its connection to hfnode10, and is killed too
        follower = _popen(c, "logs", run, "-f")
        again = _Reader(follower)
        wait_for(lambda: len(again.lines) > 30, 120, "'logs -f' to print")
        _drop_connection(10, "logs", run, "--follow")
        follower.kill()
        follower.wait(30)
        assert _going_on(c, run), f"the run stopped with its follower: {[c.record(i, run).get('state') for i in INDICES]}"
        # 3. the last 'logs -f': everything, once, in order, and it ends with the run
        t0 = time.monotonic()
        final = subprocess.run([sys.executable, "-m", "higgsfield", "logs", run, "-f"], cwd=c.dir, capture_output=True,
                               text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        took = time.monotonic() - t0
    finally:
        for p in (attached, follower):
            if p is not None and p.poll() is None:
                p.kill()
        if not all(log_has(c.rank_log(i, run), f"step {steps} loss") for i in INDICES):
            kill_run_quietly(c, run)
    assert final.returncode == 0, final.stderr[-2000:]
    got = _steps(final.stdout.splitlines())
    expect = list(range(1, steps + 1))
    assert sorted(got) == sorted((f"hfnode{i}", str(r)) for r, i in enumerate(INDICES)), sorted(got)
    for key, seq in got.items():
        assert seq == expect, f"{key}: {len(seq)} step lines, missing {sorted(set(expect) - set(seq))[:10]}, " \
                              f"repeated {sorted({s for s in seq if seq.count(s) > 1})[:10]}"
    st = c.status()[run]
    assert st["state"] == "succeeded", st
    report("control machine gone mid-run",
           f"the run survived SIGKILL of 'run' and a dropped 'logs -f'; the re-attached 'logs -f' printed all "
           f"{3 * steps} step lines once and in order and returned {took:.1f}s later, at the run's end")

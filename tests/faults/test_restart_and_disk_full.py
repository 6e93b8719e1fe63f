"""Checkpoint faults on the test bed, in a Docker run of ``src/ckpt_steps.py`` (higgsfield.checkpoint).

- a rank crash with ``--max-restarts``: the worker is SIGKILLed after a checkpoint; torchrun
  restarts it and the new worker loads the last checkpoint and goes on from its step, not 0
  (asserted on the step numbers in the rank's log);
- a disk full during a checkpoint: the run's checkpoint directory is a small tmpfs with room
  for one checkpoint; the second save fails, the run fails with the reason, the first
  checkpoint is intact, and once there is room the same run name resumes from it.

The library-level versions (a tmpfs in one process, one rank that cannot write) are in
tests/training/test_checkpoint_faults.py; tests/runs/test_multinode.py::test_max_restarts_restarts_a_killed_worker
covers the restart of a worker that does not checkpoint (it starts again at step 1).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from faults_helpers import FaultCluster, exe, kill_run_quietly, log_has, name, report, worker_pid
from runs_helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.sshd, pytest.mark.docker]

STEP = re.compile(r"^step (\d+) attempt (\d+)$")
RESUME = re.compile(r"^attempt (\d+) resumes at step (\d+) from ")
SAVED = re.compile(r"^saved step_(\d+)$")


def _parse(text: str) -> list[tuple[str, int, int]]:
    """("step", step, attempt) / ("resume", attempt, step) / ("saved", step, 0) in log order."""
    out = []
    for ln in text.splitlines():
        if m := STEP.match(ln):
            out.append(("step", int(m.group(1)), int(m.group(2))))
        elif m := RESUME.match(ln):
            out.append(("resume", int(m.group(1)), int(m.group(2))))
        elif m := SAVED.match(ln):
            out.append(("saved", int(m.group(1)), 0))
    return out


@pytest.mark.timeout(600)
def test_rank_crash_with_max_restarts_resumes_from_the_last_checkpoint(faults: FaultCluster) -> None:
    c = faults
    run = name("restart")
    steps, every = 40, 5
    c.hf("run", "ckpt_steps", "-p", f"steps={steps}", "-p", f"every={every}", "-p", "step_sleep=0.25",
         "--nodes", "1", "--max-restarts", "1", "--run-name", run, "--detach", check=True, timeout=300)
    log = c.rank_log(8, run, 0)
    try:
        wait_for(lambda: log_has(log, "saved step_00000010") and log_has(log, "step 12 attempt 0"), 300,
                 "a checkpoint at step 10 and two more steps")
        pid = wait_for(lambda: worker_pid(c.run_dir(8, run), 0), 30, "the worker process")
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        wait_for(lambda: re.search(r"^step \d+ attempt 1$", log.read_text(), re.M), 120,
                 "the restarted worker's first step")
        resumed_after = time.monotonic() - t0
        wait_for(lambda: c.record(8, run).get("state") in ("succeeded", "failed"), 300, "the run to end")
    finally:
        kill_run_quietly(c, run)
    assert c.record(8, run)["state"] == "succeeded", c.record(8, run)
    events = _parse(log.read_text())
    first = [s for kind, s, a in events if kind == "step" and a == 0]
    second = [s for kind, s, a in events if kind == "step" and a == 1]
    resumes = [(a, s) for kind, a, s in events if kind == "resume"]
    split = next(i for i, e in enumerate(events) if e[0] == "resume" and e[1] == 1)
    saved_before = [s for kind, s, _ in events[:split] if kind == "saved"]
    assert resumes[0] == (0, 0), resumes                    # a fresh run starts at 0
    assert first == list(range(len(first))), first          # attempt 0: 0, 1, ... up to the crash
    resumed_at = resumes[1][1]
    assert resumes[1][0] == 1 and resumed_at > 0, f"the restarted worker started from {resumed_at}, not from its checkpoint"
    # the newest complete checkpoint: the last one it printed, or one whose print the kill cut off
    assert resumed_at in (saved_before[-1], saved_before[-1] + every) and resumed_at <= first[-1] + 1, \
        (resumed_at, saved_before, first[-1])
    assert second == list(range(resumed_at, steps)), second  # attempt 1: from the checkpoint to the end, once each
    report("rank crash with --max-restarts 1",
           f"worker SIGKILLed after step {first[-1]}; the restarted worker loaded step_{resumed_at:08d} and "
           f"took its first step {resumed_after:.1f}s after the kill; {first[-1] + 1 - resumed_at} step(s) redone")


@contextlib.contextmanager
def _tmpfs_for(c: FaultCluster, path: Path, size: str):  # type: ignore[no-untyped-def]
    """A tmpfs of ``size`` at ``path`` (a node's checkpoint directory), owned by the node user."""
    pw = pwd.getpwnam("hfnode8")
    made = []
    p = path
    while not p.exists():
        made.append(p)
        p = p.parent
    for d in reversed(made):
        d.mkdir()
        os.chown(d, pw.pw_uid, pw.pw_gid)
    subprocess.run([exe("mount"), "-t", "tmpfs", "-o", f"size={size},uid={pw.pw_uid},gid={pw.pw_gid},mode=0700",
                    "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run([exe("umount"), "-l", str(path)], check=False)


@pytest.mark.timeout(600)
def test_disk_full_during_a_checkpoint_keeps_the_previous_one_which_then_loads(faults: FaultCluster) -> None:
    c = faults
    run = name("diskfull")
    # width 128: one checkpoint (weights + AdamW state + RNG) is about 240 KiB; the tmpfs holds one, not two
    args = ["ckpt_steps", "-p", "steps=30", "-p", "every=5", "-p", "width=128", "-p", "step_sleep=0.05",
            "--nodes", "1", "--run-name", run]
    where = c.ckpt_dir(8, "ckpt_steps", run)
    with _tmpfs_for(c, where, "360k"):
        try:
            r = c.hf("run", *args, timeout=300)
        finally:
            kill_run_quietly(c, run)
        assert r.returncode != 0, r.stderr[-2000:]
        rec = c.record(8, run)
        st = c.status()[run]
        assert st["state"] == "failed" and st["failed_node"] == "hfnode8" and st["failed_rank"] == 0, st
        # the rank's one-line reason, recorded for status and streamed to the user
        error = json.loads((c.run_dir(8, run) / "logs" / "rank0.error.json").read_text())
        reason = error["error"]
        assert reason.startswith("CheckpointError: checkpoint save of step_00000010") and "is full" in reason, reason
        assert "the last complete checkpoint, step_00000005, is intact" in reason, reason
        assert reason.splitlines()[0] == reason
        assert f"hfnode8/0 | higgsfield.contract.errors.{reason}" in r.stdout, r.stdout[-3000:]
        assert sorted(os.listdir(where)) == ["step_00000005"], os.listdir(where)  # no partial save left
        assert (where / "step_00000005" / "COMPLETE").is_file()
        log = c.rank_log(8, run, 0).read_text()
        assert "saved step_00000005" in log and "saved step_00000010" not in log
        failed_after = rec["ended_at"] - error["time"]
        # room again: the same run name resumes from the intact checkpoint
        subprocess.run([exe("mount"), "-o", "remount,size=8m", str(where)], check=True)
        try:
            r = c.hf("run", *args, timeout=300)
        finally:
            kill_run_quietly(c, run)
        assert r.returncode == 0, r.stderr[-2000:]
        log = c.rank_log(8, run, 0).read_text()
        assert f"attempt 0 resumes at step 5 from {where}" in log, log[-2000:]
        again = [s for kind, s, _ in _parse(log.split(f"attempt 0 resumes at step 5 from {where}")[1]) if kind == "step"]
        assert again == list(range(5, 30)), again   # from the checkpoint on, once each
        assert sorted(os.listdir(where)) == ["step_00000025", "step_00000030"]
    report("disk full during a checkpoint",
           f"save of step 10 failed on a full 360 KiB tmpfs; run failed {failed_after:.2f}s after the error with "
           "the reason; step_00000005 intact and resumed from once there was room")

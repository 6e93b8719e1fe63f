"""Node-local checkpoints on the test bed: 2 nodes x 2 ranks that share no disk (separate users, homes).

A real ``higgsfield run`` of ``src/ckpt_steps.py`` (a replicated linear layer: every
item DCP de-duplicates, so each node needs its own copies) saves every 4 steps; each
node keeps its part under its own ``~/.cache/higgsfield``. Running it again with the
same ``--run-name`` and more steps resumes on both nodes from the last step, read by
each node from its own disk alone.

The first run is also the rank crash of the issue, on those 2 nodes x 2 ranks with no shared
directory: it starts with ``--max-restarts 1``; once a checkpoint is COMPLETE on both nodes a
worker on node 1 is SIGKILLed, torchrun restarts the workers and every rank loads the last
checkpoint from its own node and goes on from its step, not 0 (asserted on the step numbers in
the ranks' logs), and the run still succeeds.

The run has a path mirror (``checkpoint.mirror``, a directory of this machine both node users
may write, as an NFS export would be) and runs in Docker, which is how a mirror used to be lost:
the container was never given the path. Each node's part must reach the host directory, and with
node 1's own copy of the newest step deleted the second run resumes from the mirror. A mirror a
node cannot write is refused before anything starts, in one line naming the nodes.

    flock /tmp/hf-testbed.lock pytest tests/faults/test_checkpoint_node_local_bed.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from faults_helpers import PROJECT, FaultCluster, kill_run_quietly, name, report, worker_pid
from pull_helpers import assert_same_state, load_step
from runs_helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.sshd, pytest.mark.docker]

STEP = re.compile(r"^step (\d+) attempt (\d+)$")
RESUME = re.compile(r"^attempt (\d+) resumes at step (\d+) from ")
RANKS = ((8, 0), (8, 1), (9, 2), (9, 3))   # (node, global rank): 2 ranks on each node
STEPS, EVERY = 12, 4


def _two_ranks_per_node(c: FaultCluster, mirror: str) -> str:
    """Switch the project to 2 ranks per node with ``mirror``; returns the old higgsfield.yml to put back."""
    yml = c.dir / "higgsfield.yml"
    old = yml.read_text()
    assert "nproc_per_node: 1\n" in old and "checkpoint:" not in old
    yml.write_text(old.replace("nproc_per_node: 1\n", "nproc_per_node: 2\n") + f"checkpoint:\n  mirror: {mirror}\n")
    return old


def _shared_mirror() -> Path:
    """A directory both node users write, files readable by the other (default ACLs override the runs' umask
    0077): what an NFS export mounted on every node gives a run."""
    d = Path(tempfile.mkdtemp(prefix="hf-mirror-", dir="/tmp"))
    d.chmod(0o777)
    subprocess.run(["setfacl", "-d", "-m", "u::rwx,g::rwx,o::rwx", str(d)], check=True, timeout=30)
    return d


@pytest.mark.timeout(600)
def test_two_nodes_without_a_shared_disk_save_and_resume_from_their_own_parts(faults: FaultCluster) -> None:
    c = faults
    run = name("nodelocal")
    args = ["ckpt_steps", "-p", f"every={EVERY}", "--nodes", "2", "--run-name", run]
    # A mirror no node user can write (root's home): node 0 (started first) refuses it, and nothing starts
    old = _two_ranks_per_node(c, f"/root/hf-mirror-{uuid.uuid4().hex[:8]}")
    bad = c.hf("run", *args, "--detach", timeout=120)
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode != 0 and len(lines) == 1, (bad.returncode, bad.stderr)
    assert "failed to start on 1 node(s): hfnode8: " in lines[0] and "checkpoint.mirror /root/hf-mirror-" in \
        lines[0] and "cannot be written by user hfnode8 on this node (Permission denied)" in lines[0], lines[0]
    assert not c.record(8, run) and not c.record(9, run), "a refused start left a record"
    (c.dir / "higgsfield.yml").write_text(old)
    mirror = _shared_mirror()
    _two_ranks_per_node(c, str(mirror))
    parts = {i: c.ckpt_dir(i, "ckpt_steps", run) for i in (8, 9)}
    first: subprocess.Popen[str] | None = None
    try:
        # 0.5 s a step: the kill lands well before the last step, with a checkpoint every 4 steps behind it
        first = c.popen("run", *args, "-p", f"steps={STEPS}", "-p", "step_sleep=0.5", "--max-restarts", "1")
        wait_for(lambda: first.poll() is not None or _complete_on_both(parts) > 0, 300,
                 "a checkpoint COMPLETE on both nodes")
        assert first.poll() is None, "the run ended before a worker could be killed"
        pid = wait_for(lambda: worker_pid(c.run_dir(9, run), 2), 30, "rank 2's worker on node 1")
        complete = _complete_on_both(parts)   # the newest checkpoint both nodes hold at the kill
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        try:   # 8 steps of 0.5 s and a restart: well under a minute when it works
            out, err = first.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            tails = {rank: _tail(c.rank_log(i, run, rank)) for i, rank in RANKS}
            pytest.fail(f"the run did not end within 180 s of the kill; the ranks' logs end: {tails}")
        run_s = time.monotonic() - t0
        assert first.returncode == 0, out[-3000:] + err[-3000:]
        assert [c.record(i, run).get("state") for i in (8, 9)] == ["succeeded"] * 2, \
            [c.record(i, run) for i in (8, 9)]
        resumed_at = _assert_resumed_from_the_checkpoint(c, run, complete)
        for i, ranks in ((8, (0, 1)), (9, (2, 3))):
            steps = sorted(p.name for p in parts[i].iterdir() if p.name.startswith("step_"))
            assert steps == ["step_00000008", "step_00000012"], (i, steps)  # keep_last=2 on each node
            files = {p.name for p in (parts[i] / "step_00000012").iterdir()}
            assert {n for n in files if n.endswith(".distcp")} == {f"__{r}_0.distcp" for r in ranks}, files
            assert {".metadata", "trainer.pt", "COMPLETE"} <= files, files
        # the containers' uploads reached the host directory: both nodes' parts of the newest step, COMPLETE
        on_mirror = mirror / PROJECT / "ckpt_steps" / run / "step_00000012"
        marker = json.loads((on_mirror / "COMPLETE").read_text())
        assert marker["parts"] == [[0, 1], [2, 3]], marker
        owners = {p.name: p.stat().st_uid for p in (on_mirror / marker["token"]).glob("part*.done")}
        assert sorted(owners) == ["part0.done", "part1.done"] and len(set(owners.values())) == 2, owners
        shutil.rmtree(parts[9] / "step_00000012")   # node 1's own part lost, and node 0's buddy copy of it:
        shutil.rmtree(parts[8] / ".replicas" / "step_00000012", ignore_errors=True)   # it resumes from the mirror's
        second = c.hf("run", *args, "-p", "steps=16", "-p", "step_sleep=0.05", timeout=300)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    finally:
        if first is not None and first.poll() is None:
            first.kill()
            first.communicate(timeout=30)
        (c.dir / "higgsfield.yml").write_text(old)
        kill_run_quietly(c, run)
        shutil.rmtree(mirror, ignore_errors=True)
    report("rank crash with --max-restarts 1 on 2 nodes x 2 ranks, no shared disk, a path mirror in Docker",
           f"a worker on node 1 SIGKILLed with step_{complete:08d} complete on both nodes; every rank "
           f"resumed from step_{resumed_at:08d} of its own node; the run succeeded {run_s:.1f}s after the kill")
    for i, rank in RANKS:
        log = c.rank_log(i, run, rank).read_text()
        assert f"attempt 0 resumes at step 12 from {c.ckpt_dir(i, 'ckpt_steps', run)}" in log, log[-2000:]
        again = [int(m) for m in re.findall(r"^step (\d+) attempt 0$", log.split("resumes at step 12")[-1], re.M)]
        assert again == list(range(12, 16)), (rank, again)

    # `higgsfield pull` over SSH: both nodes' parts merged into one step that loads on 1 rank, equal to each part
    dest = c.dir.parent / f"pulled-{run}"
    pulled = c.hf("pull", run, str(dest), "--logs", timeout=300)
    assert pulled.returncode == 0, pulled.stdout[-3000:] + pulled.stderr[-3000:]
    step = dest / "step_00000016"
    assert {f"__{r}_0.distcp" for r in range(4)} <= {p.name for p in step.iterdir()}
    merged = load_step(dest, 32, c.dir.parent / f"{run}-merged.pt")
    assert merged["step"] == 16 and merged["missing"] == [], merged["missing"]
    for i in (8, 9):  # each node's part alone holds its own copy of every (replicated) item: the same state
        assert_same_state(merged, load_step(parts[i] / "step_00000016", 32, c.dir.parent / f"{run}-{i}.pt",
                                            mode="dcp"))
    assert {p.name for p in (dest / "logs").iterdir()} == {"hfnode8", "hfnode9"}
    again = c.hf("pull", run, str(dest), timeout=300)
    assert again.returncode == 0 and "0 file(s) copied" in again.stdout, again.stdout + again.stderr


def _complete_on_both(parts: dict[int, Path]) -> int:
    """The newest checkpoint step that is COMPLETE on every node's own disk (0: none yet)."""
    done: list[set[int]] = []
    for d in parts.values():
        try:
            done.append({int(p.name[5:]) for p in d.iterdir()
                         if p.name.startswith("step_") and (p / "COMPLETE").is_file()})
        except (OSError, ValueError):
            return 0
    common = set.intersection(*done)
    return max(common) if common else 0


def _assert_resumed_from_the_checkpoint(c: FaultCluster, run: str, complete: int) -> int:
    """Every rank: attempt 0 from step 0, then the restarted worker from the newest checkpoint on. Its step."""
    resumed: dict[int, int] = {}
    for i, rank in RANKS:
        log = c.rank_log(i, run, rank).read_text()
        events: list[tuple[str, int, int]] = []   # ("resume", attempt, step) / ("step", step, attempt), in order
        for ln in log.splitlines():
            if m := RESUME.match(ln):
                events.append(("resume", int(m[1]), int(m[2])))
            elif m := STEP.match(ln):
                events.append(("step", int(m[1]), int(m[2])))
        resumes = [(a, at) for kind, a, at in events if kind == "resume"]
        assert len(resumes) == 2 and resumes[0] == (0, 0), (rank, resumes, log[-2000:])  # fresh, then restarted once
        split = next(n for n, e in enumerate(events) if e[0] == "resume" and n > 0)
        before = [s for kind, s, _ in events[:split] if kind == "step"]
        after = [(s, a) for kind, s, a in events[split:] if kind == "step"]
        attempt, at = resumes[1]
        assert attempt == 1, (rank, resumes)    # torchrun's restart count: the worker is a restarted one
        assert at > 0, f"rank {rank}'s restarted worker started from {at}, not from its checkpoint"
        # the newest checkpoint both nodes held at the kill, or the next one if its save was done just after
        assert at in (complete, complete + EVERY) and at <= before[-1] + 1, (rank, at, complete, before)
        assert before == list(range(len(before))), (rank, before)          # attempt 0: 0, 1, ... up to the crash
        assert after == [(s, 1) for s in range(at, STEPS)], (rank, after)   # from the checkpoint to the end, once
        resumed[rank] = at
    assert len(set(resumed.values())) == 1, f"the ranks resumed from different steps: {resumed}"
    return resumed[0]


def _tail(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-3:]
    except OSError as e:
        return [str(e)]

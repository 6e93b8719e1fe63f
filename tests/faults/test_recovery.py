"""A run that loses a node goes on by itself on the survivors, laptop gone, from the lost node's buddy copy.

A 3-node run of ``ckpt_steps`` (no shared disk, no mirror) started with ``--min-nodes 2
--detach`` (the laptop is gone from the start). Once a checkpoint is complete, hfnode10
(node 2) dies: its sshd and sessions stop, every process of its run is SIGKILLed, its
container too. What must hold, read from the survivors' disks and then through the CLI:

- the survivors regroup by themselves (no control side): a second attempt on hfnode8 and
  hfnode9 (its header says why), world size 3 -> 2, resumed from the last step complete on
  the three old nodes (node 2's part from its buddy copy on node 0, which also holds it
  whole), and the run succeeds;
- ``status`` says succeeded; ``logs`` shows both attempts under their headers;
- the lost node, back, is not part of the run (its record stays as the power cut left it).

In the Docker runtime (the fault cluster's own; its process runtime has no numpy for the checkpoint,
and the regroup is the supervisor's, the same in both: tests/node/test_recovery_coordinator.py).
"""

from __future__ import annotations

import re
import signal
import subprocess

import pytest
from faults_helpers import (
    FaultCluster,
    kill_run_quietly,
    log_has,
    name,
    node_processes,
    poll,
    report,
    signal_all,
)
from runs_helpers import exe, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.sshd, pytest.mark.docker]

DEAD, SURVIVORS = 10, (8, 9)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("runtime", ["docker"])
def test_a_lost_node_is_recovered_from_by_the_survivors_alone(faults: FaultCluster, runtime: str) -> None:
    c = faults
    run = name(f"recover-{runtime}")
    yml = c.dir / "higgsfield.yml"
    old = yml.read_text()
    if runtime != "docker":
        yml.write_text(old.replace("runtime: docker", f"runtime: {runtime}"))
    victim = c.bed.make_host(DEAD)  # type: ignore[attr-defined]
    try:
        c.hf("run", "ckpt_steps", "-p", "steps=30", "-p", "every=5", "-p", "step_sleep=0.2", "--run-name", run,
             "--min-nodes", "2", "--detach", check=True, timeout=300)
        wait_for(lambda: all(log_has(c.rank_log(i, run), "saved step_00000010") for i in (8, 9, 10)), 300,
                 "the checkpoint after step 9 complete on every node")
        c.bed.stop_host(victim, kill_sessions=True)  # type: ignore[attr-defined]
        signal_all(node_processes(DEAD), signal.SIGKILL)
        subprocess.run([exe("docker"), "kill", c.container("ckpt_steps", run, DEAD)], capture_output=True)

        def second_attempt_steps() -> bool:
            log = c.rank_log(8, run).read_text(errors="replace")
            return bool(re.search(r"resumes at step [1-9]\d*", log))

        took = poll(second_attempt_steps, 120)
        done = poll(lambda: all(c.record(i, run).get("state") in ("succeeded", "failed") for i in SURVIVORS), 180)
        records = {i: c.record(i, run) for i in SURVIVORS}
        report(f"node lost mid-run, recovered ({runtime})",
               f"the survivors resumed {took:.1f}s after the fault" if took is not None else "no resume")
        assert done is not None and all(r["state"] == "succeeded" for r in records.values()), records
        for r in records.values():
            assert r["lost"] == ["hfnode10"] and r["nnodes"] == 2, r
            whys = [a["why"] for a in r["attempts"]]
            assert whys == ["first start", "recovery 1: hfnode10 lost"], whys
            assert r["attempts"][1]["nodes"] == ["hfnode8", "hfnode9"]
        resumed = [int(m) for m in re.findall(r"resumes at step (\d+)", c.rank_log(8, run).read_text())]
        assert resumed[0] == 0 and resumed[-1] >= 10, resumed   # from the step complete on all three
        again = re.findall(r"^step (\d+) attempt 0$", c.rank_log(9, run).read_text().split("resumes at step")[-1],
                           re.M)
        assert [int(s) for s in again] == list(range(resumed[-1], 30)), again
    finally:
        signal_all(node_processes(DEAD), signal.SIGKILL)
        subprocess.run([exe("docker"), "kill", c.container("ckpt_steps", run, DEAD)], capture_output=True)
        c.bed.start_host(victim)  # type: ignore[attr-defined]
        yml.write_text(old)
        kill_run_quietly(c, run)
    st = c.status()[run]
    assert st["state"] == "succeeded", st
    logs = c.hf("logs", run, "--node", "hfnode8", timeout=120).stdout
    assert "attempt 2 (recovery 1: hfnode10 lost) on hfnode8, hfnode9" in logs, logs[-3000:]


@pytest.mark.timeout(600)
def test_a_spare_takes_the_lost_node_s_place(faults: FaultCluster) -> None:
    """``--nodes 2 --spares 1``: hfnode10 stands by, holding its slots; hfnode9 dies; hfnode10 becomes node 1 and
    gets node 1's part from its buddy copy on hfnode8 (the same world size: the run goes on at its size)."""
    c = faults
    run = name("spare")
    victim = c.bed.make_host(9)  # type: ignore[attr-defined]
    try:
        c.hf("run", "ckpt_steps", "-p", "steps=30", "-p", "every=5", "-p", "step_sleep=0.2", "--run-name", run,
             "--nodes", "2", "--spares", "1", "--detach", check=True, timeout=300)
        wait_for(lambda: all(log_has(c.rank_log(i, run), "saved step_00000010") for i in (8, 9)), 300,
                 "the checkpoint after step 9 complete on both nodes")
        spare = c.record(10, run)
        assert spare["spare"] is True and spare["slots"], spare   # standing by, holding its slots
        c.bed.stop_host(victim, kill_sessions=True)  # type: ignore[attr-defined]
        signal_all(node_processes(9), signal.SIGKILL)
        subprocess.run([exe("docker"), "kill", c.container("ckpt_steps", run, 9)], capture_output=True)
        done = poll(lambda: all(c.record(i, run).get("state") in ("succeeded", "failed") for i in (8, 10)), 240)
        records = {i: c.record(i, run) for i in (8, 10)}
        assert done is not None and all(r["state"] == "succeeded" for r in records.values()), records
        for r in records.values():
            assert r["lost"] == ["hfnode9"] and r["nnodes"] == 2 and not r["spare"], r
            assert r["attempts"][-1]["why"] == "recovery 1: hfnode9 lost"
            assert r["attempts"][-1]["nodes"] == ["hfnode8", "hfnode10"]
        log = c.rank_log(10, run, rank=1).read_text()
        resumed = [int(m) for m in re.findall(r"resumes at step (\d+)", log)]
        assert len(resumed) == 1 and resumed[0] >= 10, log[-2000:]   # its one attempt: from the step
        steps = [int(s) for s in re.findall(r"^step (\d+) attempt 0$", log, re.M)]
        assert steps == list(range(resumed[0], 30)), steps
    finally:
        signal_all(node_processes(9), signal.SIGKILL)
        subprocess.run([exe("docker"), "kill", c.container("ckpt_steps", run, 9)], capture_output=True)
        c.bed.start_host(victim)  # type: ignore[attr-defined]
        kill_run_quietly(c, run)
    st = c.status()[run]
    assert st["state"] == "succeeded" and st["node_states"]["hfnode9"] == "lost", st

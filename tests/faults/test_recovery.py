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

In both runtimes: Docker (the fault cluster's own), and the process runtime, whose ranks run in the bed's
node interpreter (torch and numpy, as a project environment would have them: tests/testbed.py).
"""

from __future__ import annotations

import re
import signal
import subprocess

import pytest
from faults_helpers import (
    FaultCluster,
    Hooks,
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
@pytest.mark.parametrize("runtime", ["docker", "process"])
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
        wait_for(lambda: all(log_has(c.rank_log(i, run), "saved step_00000010") for i in (8, 9, 10))
                 or c.record(8, run).get("state") == "failed", 300, "the checkpoint after step 9 complete on every node")
        assert c.record(8, run).get("state") != "failed", c.record(8, run)
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
@pytest.mark.parametrize("runtime", ["docker", "process"])
def test_node_0_lost_its_heir_coordinates_and_a_spare_takes_its_place(faults: FaultCluster, runtime: str) -> None:
    """``--nodes 2 --spares 1``: hfnode10 stands by, holding its slots; hfnode8, node 0, which hosts the run's
    coordinator and its rendezvous, dies. hfnode9 takes the coordinator over on its standby port, hfnode10 joins it
    there and becomes node 1; hfnode9 gets node 0's part from its buddy copy, hfnode10 node 1's from hfnode9
    (the same world size: the run goes on at its size), and the new node 0 hosts the rendezvous. ``notify:`` to
    a webhook on loopback: hfnode8 says ``started``; hfnode9, node 0 once it took over, says ``lost``,
    ``recovered`` and ``succeeded``; the webhook's URL (a secret) is in no record or log. In both runtimes: in the
    process runtime the spare's ranks and the heir's coordinator run as plain processes of the node users."""
    c = faults
    run = name(f"heir-{runtime}")
    victim = c.bed.make_host(8)  # type: ignore[attr-defined]
    yml, env = c.dir / "higgsfield.yml", c.dir / "env"
    old_yml, old_env = yml.read_text(), env.read_text() if env.exists() else None
    hooks = Hooks()
    env.write_text((old_env or "") + f"NOTIFY_HOOK={hooks.url}\n")
    yml.write_text(old_yml.replace("runtime: docker", f"runtime: {runtime}")
                   + "notify:\n  to: [NOTIFY_HOOK]\n  events: [started, lost, recovered, succeeded]\n")
    try:
        c.hf("run", "ckpt_steps", "-p", "steps=30", "-p", "every=5", "-p", "step_sleep=0.2", "--run-name", run,
             "--nodes", "2", "--spares", "1", "--detach", check=True, timeout=300)
        wait_for(lambda: all(log_has(c.rank_log(i, run), "saved step_00000010") for i in (8, 9))
                 or c.record(8, run).get("state") == "failed", 300, "the checkpoint after step 9 complete on both nodes")
        assert c.record(8, run).get("state") != "failed", c.record(8, run)
        spare = c.record(10, run)
        assert spare["spare"] is True and spare["slots"], spare   # standing by, holding its slots
        c.bed.stop_host(victim, kill_sessions=True)  # type: ignore[attr-defined]
        signal_all(node_processes(8), signal.SIGKILL)
        subprocess.run([exe("docker"), "kill", c.container("ckpt_steps", run, 8)], capture_output=True)
        done = poll(lambda: all(c.record(i, run).get("state") in ("succeeded", "failed") for i in (9, 10)), 240)
        records = {i: c.record(i, run) for i in (9, 10)}
        assert done is not None and all(r["state"] == "succeeded" for r in records.values()), records
        for r in records.values():
            assert r["lost"] == ["hfnode8"] and r["nnodes"] == 2 and not r["spare"], r
            assert r["attempts"][-1]["why"] == "recovery 1: hfnode8 lost"
            assert r["attempts"][-1]["nodes"] == ["hfnode9", "hfnode10"]
        assert records[9]["node_rank"] == 0 and records[10]["node_rank"] == 1
        launcher = (c.run_dir(9, run) / "logs" / "launcher.log").read_text(errors="replace")
        assert "this node takes the coordinator over" in launcher, launcher[-2000:]
        log = c.rank_log(10, run, rank=1).read_text()
        resumed = [int(m) for m in re.findall(r"resumes at step (\d+)", log)]
        assert len(resumed) == 1 and resumed[0] >= 10, log[-2000:]   # its one attempt: from the step
        steps = [int(s) for s in re.findall(r"^step (\d+) attempt 0$", log, re.M)]
        assert steps == list(range(resumed[0], 30)), steps
        poll(lambda: "succeeded" in hooks.events(run), 30)
        assert hooks.events(run) == ["started", "lost", "recovered", "succeeded"], hooks.got
        assert "node: hfnode8" in hooks.body(run, "lost") and "recovery 1" in hooks.body(run, "recovered")
        for i in (9, 10):
            for f in [c.run_dir(i, run) / "run.json", *(c.run_dir(i, run) / "logs").glob("*.log")]:
                assert hooks.secret not in f.read_text(errors="replace"), f
    finally:
        hooks.server.shutdown()
        yml.write_text(old_yml)
        if old_env is None:
            env.unlink(missing_ok=True)
        else:
            env.write_text(old_env)
        signal_all(node_processes(8), signal.SIGKILL)
        subprocess.run([exe("docker"), "kill", c.container("ckpt_steps", run, 8)], capture_output=True)
        c.bed.start_host(victim)  # type: ignore[attr-defined]
        kill_run_quietly(c, run)
    st = c.status()[run]
    assert st["state"] == "succeeded" and st["node_states"]["hfnode8"] == "lost", st


@pytest.mark.timeout(600)
def test_on_straggler_replace_puts_the_slow_node_out_for_a_spare(faults: FaultCluster) -> None:
    """``on_straggler: replace``, ``--nodes 2 --spares 1``: hfnode9's rank takes 2x as long per step from step 8.
    It is named by its own work per step, and its node is put out of the run as a lost node is: the spare,
    hfnode10, takes its place, and the run starts again on hfnode8 and hfnode10 and succeeds. hfnode9 stays up
    (a slow node is no dead one) and its part of the run ends, naming why."""
    c = faults
    run = name("replace")
    yml = c.dir / "higgsfield.yml"
    old = yml.read_text()
    yml.write_text(old + "on_straggler: replace\n")
    try:
        c.hf("run", "slow_node", "-p", "steps=40", "-p", "slow_node=hfnode9", "--run-name", run,
             "--nodes", "2", "--spares", "1", "--detach", check=True, timeout=300)
        done = poll(lambda: all(c.record(i, run).get("state") in ("succeeded", "failed") for i in (8, 10)), 300)
        records = {i: c.record(i, run) for i in (8, 9, 10)}
        assert done is not None and all(records[i]["state"] == "succeeded" for i in (8, 10)), records
        for i in (8, 10):
            r = records[i]
            assert r["lost"] == ["hfnode9"] and r["nnodes"] == 2, r
            assert r["attempts"][-1]["why"] == "recovery 1: hfnode9 replaced (a straggler)", r["attempts"]
            assert r["attempts"][-1]["nodes"] == ["hfnode8", "hfnode10"]
        (s,) = records[8]["stragglers"][:1] or [None]
        assert s is not None and s["node"] == "hfnode9", records[8]["stragglers"]
        assert records[9]["state"] == "failed" and "a straggler" in (records[9].get("reason") or ""), records[9]
        log = c.rank_log(10, run, rank=1).read_text()
        assert "step 40 on hfnode10" in log, log[-2000:]
    finally:
        yml.write_text(old)
        kill_run_quietly(c, run)
    st = c.status()[run]
    assert st["state"] == "succeeded" and st["node_states"]["hfnode9"] == "lost", st

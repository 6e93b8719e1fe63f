"""A node dies mid-run, with no control machine attached: the survivors fail the run within 10 s, naming it.

Two ways to die, for hfnode10 of a 3-node Docker run started with ``--detach`` (the
laptop is gone from the start), and the master (hfnode8, node 0) killed too:

- killed: its sshd and sessions stop, every process of its run is SIGKILLed, its
  container too. Its peers' sockets are closed by the kernel.
- frozen: its sshd and sessions stop and every process of its run is SIGSTOPped: the
  sockets stay open and nothing answers, as with a power cut or a network partition.
  Only a node-side watch (heartbeats) can notice.

What is measured: from the fault to the run's records on both survivors saying
``failed`` with no process of the run left there (read from their disks, no control
side involved). Then, the node back, ``status`` names the dead node as the failing one.
See also tests/runs/test_multinode.py::test_node_dying_mid_run_fails_the_run_naming_it
(the same fault with ``higgsfield run`` attached, on the shared hosts).
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from faults_helpers import (
    INDICES,
    FaultCluster,
    containers,
    kill_run_quietly,
    log_has,
    name,
    node_processes,
    poll,
    report,
    signal_all,
)
from runs_helpers import exe, run_processes, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.sshd, pytest.mark.docker]

DEADLINE_S = 10.0   # the figure: every survivor stopped within 10 s
WATCH_S = 60.0      # how long we wait to measure a slower result (reported, then failed)


def _survivors_failed(c: FaultCluster, run: str, survivors: list[int]) -> bool:
    return all(c.record(i, run).get("state") == "failed" and not run_processes(c.run_dir(i, run)) for i in survivors)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("how", "dead"), [("killed", 10), ("frozen", 10), ("killed", 8)],
                         ids=["killed", "frozen", "master-killed"])
def test_node_dying_mid_run_fails_it_everywhere_within_10s_naming_it(faults: FaultCluster, how: str,
                                                                     dead: int) -> None:
    c = faults
    bed = c.bed
    run = name(f"die-{how}")
    survivors = [i for i in INDICES if i != dead]
    c.hf("run", "regression", "-p", "steps=100000", "-p", "step_sleep=0.2", "--run-name", run, "--detach",
         check=True, timeout=300)
    victim = bed.make_host(dead)  # type: ignore[attr-defined]
    frozen: list[int] = []
    try:
        wait_for(lambda: all(log_has(c.rank_log(i, run), "step 3 ") for i in INDICES), 300, "every rank stepping")
        bed.stop_host(victim, kill_sessions=True)  # type: ignore[attr-defined]
        t0 = time.monotonic()  # from here its run's processes are dead (or frozen)
        if how == "killed":
            signal_all(node_processes(dead), signal.SIGKILL)
            subprocess.run([exe("docker"), "kill", c.container("regression", run, dead)], capture_output=True)
        else:
            frozen = node_processes(dead)
            signal_all(frozen, signal.SIGSTOP)
        took = None if poll(lambda: _survivors_failed(c, run, survivors), WATCH_S) is None else time.monotonic() - t0
        states = {i: c.record(i, run).get("state") for i in survivors}
        left = {i: run_processes(c.run_dir(i, run)) for i in survivors}
        report(f"node {how} mid-run" if dead != 8 else "master node (node 0) killed mid-run",
               f"run failed on both survivors, nothing left running, {took:.1f}s after the fault" if took is not None
               else f"survivors not stopped after {WATCH_S:.0f}s (states {states}, processes left {left})")
        assert took is not None, f"{WATCH_S:.0f}s after hfnode{dead} was {how}: states {states}, processes {left}"
        assert took <= DEADLINE_S, f"the survivors stopped {took:.1f}s after hfnode{dead} was {how} (> {DEADLINE_S}s)"
        for i in survivors:
            rec = c.record(i, run)
            named = rec.get("failed_node") == f"hfnode{dead}" or f"hfnode{dead}" in str(rec.get("reason"))
            assert named, f"hfnode{i}'s record does not name hfnode{dead}: {rec.get('failed_node')} / {rec.get('reason')}"
    finally:
        signal_all(node_processes(dead), signal.SIGKILL)   # the dead node's leftovers, frozen or not
        subprocess.run([exe("docker"), "kill", c.container("regression", run, dead)], capture_output=True)
        bed.start_host(victim)  # type: ignore[attr-defined]
        if not _survivors_failed(c, run, survivors):
            kill_run_quietly(c, run)
    # the node is back: status names it as the first failure, and nothing of the run is left anywhere
    st = c.status()[run]
    assert st["state"] == "failed" and st["failed_node"] == f"hfnode{dead}", st
    wait_for(lambda: containers(run) == [], 60, "the dead node's container to be cleaned up")
    kill_run_quietly(c, run)

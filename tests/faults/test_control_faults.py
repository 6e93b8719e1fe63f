"""Faults between the control machine and the nodes: a node down during setup, a command hanging
past its timeout, a host key changed. On hosts hfnode8..10 of the fault project.

- node down during setup: hfnode10's every command is slowed (sshd ForceCommand, 1 s) so setup
  is still working there when its sshd and sessions are killed; the other nodes finish, the
  run of setup ends naming hfnode10 at once, and a re-run finishes the job.
  (tests/provision/test_setup_sshd.py::test_stopped_sshd_fails_only_that_node_quickly covers a node
  that is down before setup starts.)
- a hanging command: hfnode10's commands wait 10 s before they run, the project's
  ``ssh.command_timeout`` is 4 s: setup and run give up on hfnode10 after the timeout, say so,
  finish with the others, and a run is never left started half-way. (``status``, ``kill`` and
  ``logs`` use their own fixed 60 s limit, which the bed's delay of at most 10 s cannot pass.)
- a changed host key: hfnode9 gets a new host key; run and status refuse before any command runs
  on any node, name it and say how to re-pin. (tests/provision/test_setup_sshd.py and
  tests/remote/test_ssh.py cover setup and the transport.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from faults_helpers import INDICES, FaultCluster, containers, kill_run_quietly, name, report
from runs_helpers import run_processes, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.sshd, pytest.mark.docker]

SETUP_STEPS = ["--step", "os", "--step", "docker", "--step", "docker-group", "--step", "base-image"]


def _hf(c: FaultCluster, *args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIGGSFIELD_")}
    env.update(PYTHONUNBUFFERED="1", COLUMNS="250")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=c.dir, env=env, capture_output=True,
                       text=True, timeout=timeout)
    return r, time.monotonic() - t0


def _delay(c: FaultCluster, i: int, seconds: float | None) -> None:
    """Every SSH command on node i waits ``seconds`` first (None: no wrapper); its sshd restarts."""
    c.bed.ensure_hosts(0, c.bed.state_dir(), indices=[i], reset_docker_group=False, delay=seconds)  # type: ignore[attr-defined]


@pytest.mark.timeout(600)
def test_a_node_dying_during_setup_fails_only_that_node_and_a_rerun_finishes(faults: FaultCluster) -> None:
    c = faults
    bed = c.bed
    for i in INDICES:  # real work for setup on every node: the docker-group step applies
        bed.remove_from_docker_group(bed.make_host(i))  # type: ignore[attr-defined]
    _delay(c, 10, 1.0)
    log = c.dir / ".higgsfield" / "logs" / "setup" / "hfnode10.log"
    log.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIGGSFIELD_")}
    env.update(PYTHONUNBUFFERED="1", COLUMNS="250")
    proc = subprocess.Popen([sys.executable, "-m", "higgsfield", "setup", *SETUP_STEPS], cwd=c.dir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[tuple[str, str]] = []
    ended: list[float] = []

    def read() -> None:
        out.append(proc.communicate(timeout=300))
        ended.append(time.monotonic())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: log.exists() and "## docker: check" in log.read_text(), 120, "setup to reach hfnode10's docker step")
        t0 = time.monotonic()   # stopping the host takes a moment: setup may notice before it returns
        bed.stop_host(bed.make_host(10), kill_sessions=True)  # type: ignore[attr-defined]
        reader.join(120)
        took = (ended[0] if ended else time.monotonic()) - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        _delay(c, 10, None)
    stdout, stderr = out[0] if out else ("", "")
    assert proc.returncode == 1, stdout + stderr
    assert "setup failed on 1 of 3 node(s): hfnode10" in stderr, stderr
    rows = {ln.split()[1]: ln for ln in stdout.splitlines() if ln.startswith("│ hfnode")}
    assert "added hfnode8 to the docker group" in stdout and "added hfnode9 to the docker group" in stdout, stdout
    assert "failed" in rows["hfnode10"] or "unreachable" in rows["hfnode10"], rows
    # the step it was in when its sshd went: docker's check, or docker-group's apply once the check was answered
    assert re.search(r"^## [a-z-]+: failed", log.read_text(), re.M) or "connect failed" in log.read_text(), \
        log.read_text()[-2000:]
    report("node down during setup",
           f"setup ended {took:.1f}s after hfnode10's sshd and sessions were killed mid-step, naming it; hfnode8, hfnode9 finished")
    # back up: a re-run finishes hfnode10 (and changes nothing on the others)
    r, spent = _hf(c, "setup", *SETUP_STEPS, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all 3 node(s) ready" in r.stdout, r.stdout
    assert "added hfnode10 to the docker group" in r.stdout or "hfnode10 can use docker" in r.stdout, r.stdout


@pytest.mark.timeout(600)
def test_a_command_hanging_past_its_timeout_is_given_up_and_named(faults: FaultCluster) -> None:
    c = faults
    cfg = c.dir / "hang.yml"   # the project's config with a 4 s command timeout (the known_hosts file is shared)
    cfg.write_text((c.dir / "higgsfield.yml").read_text().replace("  retries: 1\n", "  retries: 1\n  command_timeout: 4\n"))
    run = name("hang")
    _delay(c, 10, 10.0)
    try:
        r, took_setup = _hf(c, "--config", str(cfg), "setup", "--step", "os", timeout=120)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "setup failed on 1 of 3 node(s): hfnode10" in r.stderr and "timed out after 4s" in r.stdout, \
            r.stdout + r.stderr
        r, took_run = _hf(c, "--config", str(cfg), "run", "regression", "-p", "steps=1000", "-p", "step_sleep=0.2",
                          "--run-name", run, "--detach", timeout=300)
        assert r.returncode != 0, r.stdout + r.stderr
        err = r.stderr.strip().splitlines()[-1]
        assert "hfnode10" in err and "timed out after 4s" in err, r.stderr   # one line, no traceback
        assert "Traceback" not in r.stderr
    finally:
        _delay(c, 10, None)
    # the hung node never starts the run later, and nothing of it runs anywhere
    time.sleep(12)
    assert containers(run) == []
    for i in INDICES:
        assert run_processes(c.run_dir(i, run)) == [], f"hfnode{i} runs {run}"
        assert c.record(i, run).get("state") in (None, "killed", "failed"), (i, c.record(i, run))
    kill_run_quietly(c, run)
    report("command hanging past its timeout",
           f"ssh.command_timeout 4s, every command on hfnode10 hangs 10s: setup gave up on it in {took_setup:.1f}s, "
           f"run refused (stopped on the others) in {took_run:.1f}s, naming hfnode10; the others unaffected")


@pytest.mark.timeout(600)
def test_a_changed_host_key_refuses_run_and_status_before_any_command(faults: FaultCluster) -> None:
    c = faults
    bed = c.bed
    h = bed.make_host(9)  # type: ignore[attr-defined]
    old = (h.host_key.read_bytes(), h.host_pubkey.read_text())
    run = name("rekey")
    sshd_log = Path(h.logfile)
    try:
        bed.rekey_host(h)  # type: ignore[attr-defined]
        accepted = sshd_log.read_text().count("Accepted publickey") if sshd_log.exists() else 0
        r, took = _hf(c, "run", "regression", "-p", "steps=5", "--run-name", run, "--detach", timeout=120)
        assert r.returncode != 0
        err = r.stderr.strip()
        assert len(err.splitlines()) == 1, err
        assert "hfnode9" in err and "changed" in err and "higgsfield setup --repin hfnode9" in err, err
        for i in INDICES:   # nothing started anywhere, not even on the nodes whose keys are fine
            assert not c.run_dir(i, run).exists(), f"hfnode{i} has a run directory for {run}"
        r, took_status = _hf(c, "status", timeout=120)
        assert r.returncode != 0 and "hfnode9" in r.stderr and "changed" in r.stderr, r.stdout + r.stderr
        assert (sshd_log.read_text().count("Accepted publickey") if sshd_log.exists() else 0) == accepted, \
            "a client authenticated to the rekeyed node"
    finally:
        bed.set_host_key(h, *old)  # type: ignore[attr-defined]
    r, _ = _hf(c, "status", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr   # the old key back: trusted again
    report("host key changed", f"run refused in {took:.1f}s and status in {took_status:.1f}s, naming hfnode9, "
           "before any command ran on any node")

"""Multi-node runs on the test bed: 3 sshd hosts, the real dockerd, the offline base image.

deploy (idempotent, image never rebuilt when unchanged), a 3-node run in Docker (host
network, master = node 0's 127.0.0.2), merged logs with node/rank prefixes and nothing
lost, status across nodes, kill within 10 s with no container or process left, the
queue (a second run wanting the same slots waits, then runs), a node dying mid-run,
a killed worker restarted by torchrun.

    make test  (or: pytest -m "sshd and docker" tests/runs)
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from runs_helpers import (
    SECRET,
    Cluster,
    exe,
    lines_by_rank,
    node_processes,
    node_states,
    run_processes,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.sshd, pytest.mark.docker]



def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _status(c: Cluster) -> dict[str, dict]:
    r = c.hf("status", "--json", timeout=120)
    return {x["run"]: x for x in json.loads(r.stdout)["runs"]}


def _state(c: Cluster, run: str) -> str | None:
    return _status(c).get(run, {}).get("state")


def _containers(run: str) -> list[str]:
    out = subprocess.run([exe("docker"), "ps", "-a", "--format", "{{.Names}}", "--filter", "label=org.higgsfield.run=" + run],
                         capture_output=True, text=True, check=True).stdout
    return out.split()


def _no_leftovers(c: Cluster, run: str, nodes: int = 3) -> None:
    assert _containers(run) == []
    for i in range(nodes):
        assert run_processes(c.run_dir(i, run)) == [], f"processes of {run} left on hfnode{i}"



def test_deploy_ships_verifies_and_never_rebuilds_an_unchanged_image(cluster: Cluster) -> None:
    from higgsfield.control.backends.nodes import deploy
    from higgsfield.control.config import load_config

    # a Dockerfile no earlier session built (a new layer), so this session's first deploy really builds
    (cluster.dir / "Dockerfile").write_text((cluster.dir / "Dockerfile").read_text().split("RUN echo session")[0]
                                            + f"RUN echo session {uuid.uuid4().hex} > /tmp/hf-session\n")
    subprocess.run([exe("git"), "commit", "-qam", "new image"], cwd=cluster.dir, check=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})
    head = subprocess.run([exe("git"), "rev-parse", "HEAD"], cwd=cluster.dir, capture_output=True, text=True,
                          check=True).stdout.strip()
    cfg = load_config(cluster.dir / "higgsfield.yml")
    t0 = time.monotonic()
    first = deploy(cfg)
    t_first = time.monotonic() - t0
    assert first.commit == head
    assert all(n.shipped for n in first.nodes), first
    tags = {n.image for n in first.nodes}
    assert len(tags) == 1 and next(iter(tags)).startswith("hf-hfrt:")
    tag = next(iter(tags))
    # nodes share one engine here: the first build makes the tag, concurrent ones may too
    assert any(n.built for n in first.nodes)
    image_id = subprocess.run([exe("docker"), "image", "inspect", "-f", "{{.Id}}", tag], capture_output=True, text=True,
                              check=True).stdout.strip()
    for i in range(3):  # the commit is recorded on every node and is the deployed tree's
        code = cluster.home(i) / ".hfrt" / "projects" / "hfrt" / "code"
        assert (code / ".higgsfield-commit").read_text().strip() == head
        assert (code / "src" / "regression.py").is_file()

    t0 = time.monotonic()
    again = deploy(cfg)
    t_again = time.monotonic() - t0
    assert not any(n.shipped for n in again.nodes) and not any(n.built for n in again.nodes), again
    assert {n.image for n in again.nodes} == {tag}
    assert subprocess.run([exe("docker"), "image", "inspect", "-f", "{{.Id}}", tag], capture_output=True, text=True,
                          check=True).stdout.strip() == image_id
    b_first = max(n.build_seconds for n in first.nodes)
    b_again = max(n.build_seconds for n in again.nodes)
    print(f"\ndeploy: first {t_first:.1f}s (shipped + built {tag}; build step {b_first:.2f}s), again {t_again:.1f}s "
          f"(nothing shipped, image not rebuilt; build step {b_again:.2f}s)")
    assert t_again < t_first and b_again < b_first

    # --dirty ships the working tree: an uncommitted file reaches every node, the image stays
    (cluster.dir / "src" / "dirty_marker.py").write_text("X = 1\n")
    try:
        r = cluster.hf("deploy", "--dirty", check=True, timeout=600)
        assert "unchanged" in r.stderr and "built" not in r.stderr.replace("not rebuilt", "")
        for i in range(3):
            code = cluster.home(i) / ".hfrt" / "projects" / "hfrt" / "code"
            assert (code / "src" / "dirty_marker.py").is_file()
            assert (code / ".higgsfield-commit").read_text().startswith(f"{head}-dirty-")
    finally:
        (cluster.dir / "src" / "dirty_marker.py").unlink()
    cluster.hf("deploy", check=True, timeout=600)  # back to HEAD for the other tests


def test_three_node_run_in_docker_logs_and_status(deployed: Cluster) -> None:
    c = deployed
    run = _name("three")
    steps = 30
    t0 = time.monotonic()
    r = c.hf("run", "regression", "-p", f"steps={steps}", "--run-name", run, timeout=600)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    assert f"run {run} succeeded" in r.stderr
    live = lines_by_rank(r.stdout)
    expect = [f"step {s} loss" for s in range(1, steps + 1)]
    for i in range(3):
        got = [t for t in live.get((f"hfnode{i}", str(i)), []) if t.startswith("step")]
        assert [g.rsplit(" ", 1)[0] for g in got] == expect, f"live stream of hfnode{i}/{i}"

    # the finished run's logs, read back: merged, prefixed, in order within each rank, nothing lost
    logs = c.hf("logs", run, timeout=120)
    assert logs.returncode == 0, logs.stderr
    merged = lines_by_rank(logs.stdout)
    for i in range(3):
        got = [t.rsplit(" ", 1)[0] for t in merged[(f"hfnode{i}", str(i))] if t.startswith("step")]
        assert got == expect
    only = lines_by_rank(c.hf("logs", run, "--node", "hfnode1", timeout=120).stdout)
    assert {k[0] for k in only} == {"hfnode1"}
    ranked = lines_by_rank(c.hf("logs", run, "--rank", "2", timeout=120).stdout)
    assert set(ranked) == {("hfnode2", "2")}

    st = _status(c)[run]
    assert st["state"] == "succeeded" and st["exit_code"] == 0
    assert st["nodes"] == ["hfnode0", "hfnode1", "hfnode2"] and st["duration"] > 0
    for i in range(3):
        rec = json.loads((c.run_dir(i, run) / "run.json").read_text())
        spec = json.loads((c.run_dir(i, run) / "spec.json").read_text())
        assert rec["runtime"] == "docker" and rec["container"] == f"hf-hfrt-regression-{run}-hfnode{i}"
        assert spec["master_addr"] == "127.0.0.2" and spec["node_rank"] == i and len(spec["nodes"]) == 3
        assert rec["command"][rec["command"].index("--nnodes") + 1] == "3"
    _no_leftovers(c, run)
    print(f"\n3-node docker run of {steps} steps: {took:.1f}s end to end")


@pytest.mark.timeout(300)
def test_a_rank_that_raises_is_the_first_failure_and_its_exit_code_the_runs(deployed: Cluster) -> None:
    """Rank 1 raises; its process group's end breaks the others' all_reduce, and its own process lingers.
    Node 0's torchrun ends first and node 0 is first to report, its "connection reset" once named as the
    run's cause while node 1 took the abort for news from elsewhere. The rank that raised is named;
    ``run`` and ``status`` give its own exit code, 1 (2 is what a usage error exits with)."""
    c = deployed
    run = _name("raises")
    r = c.hf("run", "probe", "-p", "allreduce=true", "-p", "fail_rank=1", "-p", "fail_after=2", "-p",
             "how=raise_slow_exit", "-p", "sleep=60", "--run-name", run, timeout=300)
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    assert f"run {run} failed (first failure: node hfnode1, rank 1)" in r.stderr, r.stderr[-3000:]
    assert "rank 1: RuntimeError: probe failure on rank 1" in r.stderr, r.stderr[-3000:]
    st = _status(c)[run]
    assert (st["state"], st["exit_code"], st["failed_node"], st["failed_rank"]) == ("failed", 1, "hfnode1", 1), st
    _no_leftovers(c, run)


def test_kill_within_10s_leaves_nothing(deployed: Cluster) -> None:
    c = deployed
    run = _name("kill")
    c.hf("run", "regression", "-p", "steps=100000", "-p", "step_sleep=0.2", "--run-name", run, "--detach",
         check=True, timeout=300)
    wait_for(lambda: all((c.run_dir(i, run) / "logs" / f"rank{i}.log").exists()
                         and "step 2" in (c.run_dir(i, run) / "logs" / f"rank{i}.log").read_text()
                         for i in range(3)), 300, "every rank to step")
    assert _state(c, run) == "running"
    # the container uses the host's network and IPC, as the node user
    inspect = json.loads(subprocess.run([exe("docker"), "inspect", f"hf-hfrt-regression-{run}-hfnode1"],
                                        capture_output=True, text=True, check=True).stdout)[0]
    assert inspect["HostConfig"]["NetworkMode"] == "host" and inspect["HostConfig"]["IpcMode"] == "host"
    uid = pwd.getpwnam("hfnode1")
    assert inspect["Config"]["User"] == f"{uid.pw_uid}:{uid.pw_gid}"
    assert len(run_processes(c.run_dir(0, run))) >= 2  # torchrun + the worker, seen from the host
    _stacks_name_every_rank(c, run)   # issue 18: `higgsfield stacks` on this healthy live run
    t0 = time.monotonic()
    r = c.hf("kill", run, timeout=60)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert f"{run}: killed" in r.stdout
    assert took < 10, f"kill took {took:.1f}s"
    _no_leftovers(c, run)
    assert _state(c, run) == "killed"
    r = c.hf("kill", run, timeout=60)
    assert r.returncode != 0 and "no queued or running run" in r.stderr
    print(f"\nkill of a 3-node docker run: {took:.1f}s (CLI start to every node stopped)")


def _stacks_name_every_rank(c: Cluster, run: str) -> None:
    """``higgsfield stacks RUN``: every rank's stack now, from every node at once (inside the containers, no
    ptrace), grouped; ``--json`` in the issue's shape, innermost frame last."""
    t0 = time.monotonic()
    r = c.hf("stacks", run, "--json", timeout=60)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert sorted((s["node"], s["rank"]) for s in got) == [("hfnode0", 0), ("hfnode1", 1), ("hfnode2", 2)], got
    for s in got:
        main = next(t for t in s["threads"] if t["name"] == "MainThread")
        assert any(f["function"] == "regression" and f["file"].endswith("regression.py") for f in main["frames"])
    r = c.hf("stacks", run, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "stacks taken now" in r.stderr
    for who in ("hfnode0/0", "hfnode1/1", "hfnode2/2"):
        assert f"== {who} (pid " in r.stdout, r.stdout
    print(f"\nstacks of a 3-node docker run: {took:.1f}s")
    assert took < 10, f"stacks took {took:.1f}s"


def _open_gate(c: Cluster, run: str, nodes: int) -> None:
    """Let a probe run with ``gate=go`` end: the file it waits for, in its run dir on each node."""
    for i in range(nodes):
        (c.run_dir(i, run) / "go").touch()


def test_queue_same_slots_wait_fifo_and_disjoint_slots_share(deployed: Cluster) -> None:
    # Every run here ends when the test says so (a gate file), never after a fixed time: under load a
    # timed run could end before the test looked at the queue (the flake this test once had).
    c = deployed
    first, second, third = _name("qa"), _name("qb"), _name("qc")
    c.hf("run", "probe", "-p", "gate=go", "--run-name", first, "--nodes", "2", "--exclusive", "--detach",
         check=True, timeout=300)
    c.hf("run", "probe", "-p", "sleep=1", "--run-name", second, "--nodes", "2", "--exclusive", "--detach",
         check=True, timeout=300)
    c.hf("run", "probe", "-p", "sleep=1", "--run-name", third, "--nodes", "2", "--exclusive", "--detach",
         check=True, timeout=300)
    wait_for(lambda: node_states(c, first) == ["running"] * 2, 300, f"{first} running")
    st = _status(c)
    assert st[second]["state"] == "queued" and st[third]["state"] == "queued"
    # a queued run is killed at once and leaves the queue
    t0 = time.monotonic()
    c.hf("kill", third, check=True, timeout=60)
    assert time.monotonic() - t0 < 10
    assert _state(c, third) == "killed"
    # the node's queue as the dashboard gets it: the first line of its feed holds the runs and the queue
    queue = json.loads(subprocess.run(
        [exe("su"), "-", "hfnode0", "-c",
         ".hfrt/venv/bin/higgsfield invoker --state-dir .hfrt stats --follow --project hfrt | head -n 1"],
        capture_output=True, text=True, check=True, timeout=60).stdout)["queue"]
    assert [e["run"] for e in queue] == [first, second]
    assert queue[0]["committed"] and queue[0]["port"] and queue[1]["slots"] is None
    _open_gate(c, first, 2)
    wait_for(lambda: node_states(c, second) == ["succeeded"] * 2, 400, f"{second} to run after {first}")
    st = _status(c)
    assert st[first]["state"] == "succeeded"
    # gang admission: the second started on no node before the first had ended on every node
    assert st[second]["started_at"] >= st[first]["ended_at"], "the queued run overlapped the first"
    assert "queued: wants 2 of" in c.hf("logs", second, "--node", "hfnode0", timeout=60).stdout

    # CPU nodes have one slot per core (2 here): two 1-process runs fit side by side, on distinct ports
    a, b = _name("sa"), _name("sb")
    for name in (a, b):
        c.hf("run", "probe", "-p", "gate=go", "--run-name", name, "--nodes", "1", "--detach", check=True,
             timeout=300)
    wait_for(lambda: node_states(c, a) == node_states(c, b) == ["running"], 300, "both running at once")
    st = _status(c)
    assert st[a]["state"] == st[b]["state"] == "running", (st[a], st[b])
    ports = {json.loads((c.run_dir(0, x) / "run.json").read_text())["master_port"] for x in (a, b)}
    assert len(ports) == 2, "two runs at once share a rendezvous port"
    _open_gate(c, a, 1)
    _open_gate(c, b, 1)
    wait_for(lambda: node_states(c, a) == node_states(c, b) == ["succeeded"], 300, "both to end")
    st = _status(c)
    assert st[a]["state"] == st[b]["state"] == "succeeded", (st[a], st[b])


def test_node_dying_mid_run_fails_the_run_naming_it(deployed: Cluster) -> None:
    c = deployed
    bed = c.bed
    run = _name("lost")
    proc = c.popen("run", "regression", "-p", "steps=100000", "-p", "step_sleep=0.2", "--run-name", run)
    host = bed.make_host(2)  # type: ignore[attr-defined]
    try:
        wait_for(lambda: (c.run_dir(2, run) / "logs" / "rank2.log").exists()
                 and "step 3" in (c.run_dir(2, run) / "logs" / "rank2.log").read_text(), 300, "rank 2 stepping")
        t0 = time.monotonic()
        # the node dies: its sshd and sessions go, its processes are killed, its container too
        bed.stop_host(host, kill_sessions=True)  # type: ignore[attr-defined]
        _kill_node_processes(2)
        subprocess.run([exe("docker"), "kill", f"hf-hfrt-regression-{run}-hfnode2"], capture_output=True)
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - t0
        assert proc.returncode != 0
        assert took < 60, f"the run noticed after {took:.1f}s"
        assert "node hfnode2 was lost" in err
        st = _status(c)[run]
        assert st["state"] == "failed" and st["failed_node"] == "hfnode2"
        for i in (0, 1):  # the survivors were stopped
            assert _containers(run) in ([], [f"hf-hfrt-regression-{run}-hfnode2"])
            assert run_processes(c.run_dir(i, run)) == []
        print(f"\nnode lost: run failed naming it after {took:.1f}s")
    finally:
        if proc.poll() is None:
            proc.kill()
        bed.start_host(host)  # type: ignore[attr-defined]
    # back up, the dead node's leftovers are cleaned by the next status
    st = _status(c)[run]
    assert st["state"] == "failed" and st["failed_node"] == "hfnode2"
    assert _containers(run) == []


def _kill_node_processes(i: int) -> None:
    """SIGKILL every process of node i that belongs to this state dir (the bed is shared with other tests)."""
    for pid in node_processes(i):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def test_max_restarts_restarts_a_killed_worker(deployed: Cluster) -> None:
    c = deployed
    run = _name("restart")
    c.hf("run", "regression", "-p", "steps=30", "-p", "step_sleep=0.3", "--run-name", run, "--nodes", "1",
         "--max-restarts", "1", "--detach", check=True, timeout=300)
    log = c.run_dir(0, run) / "logs" / "rank0.log"
    wait_for(lambda: log.exists() and "step 3" in log.read_text(), 300, "rank 0 stepping")

    def worker() -> int | None:
        for pid in run_processes(c.run_dir(0, run)):
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            if b"higgsfield.node.entrypoint" in cmd and b"torch.distributed.run" not in cmd and b"RANK=0" in env:
                return pid
        return None

    pid = wait_for(worker, 30, "the worker process")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: node_states(c, run) in (["succeeded"], ["failed"]), 400, "the run to end")
    assert _state(c, run) == "succeeded"
    text = log.read_text()
    assert text.count("step 1 loss") == 2, "the worker was not restarted"
    assert "step 30 loss" in text


def test_a_node_failing_to_launch_is_named_and_the_others_stopped(deployed: Cluster) -> None:
    c = deployed
    run = _name("nolaunch")
    code = c.home(2) / ".hfrt" / "projects" / "hfrt" / "code"
    target = os.readlink(code)
    code.unlink()
    try:
        r = c.hf("run", "regression", "-p", "steps=1000", "-p", "step_sleep=0.5", "--run-name", run, timeout=300)
        assert r.returncode != 0
        assert "hfnode2" in r.stderr and "not deployed" in r.stderr and "stopped it on hfnode0, hfnode1" in r.stderr
    finally:
        os.symlink(target, code)
        pw = pwd.getpwnam("hfnode2")
        os.lchown(code, pw.pw_uid, pw.pw_gid)
    st = _status(c)[run]
    assert {n: s for n, s in st["node_states"].items()} == {"hfnode0": "killed", "hfnode1": "killed"}
    _no_leftovers(c, run, nodes=2)


def test_params_are_validated_before_anything_starts(deployed: Cluster) -> None:
    r = deployed.hf("run", "regression", "-p", "steps=notanumber", "--run-name", _name("bad"), timeout=120)
    assert r.returncode == 2 and "steps" in r.stderr


def _holds_secret(root: Path) -> list[str]:
    """Files under ``root`` (links not followed) whose bytes contain the cluster's secret."""
    found = []
    for dirpath, _dirs, files in os.walk(root):
        if "/venv" in dirpath:
            continue
        for name in files:
            p = Path(dirpath) / name
            try:
                if not p.is_symlink() and SECRET.encode() in p.read_bytes():
                    found.append(str(p))
            except OSError:
                continue
    return found


def test_secrets_reach_a_docker_run_but_no_file_nor_docker_inspect(deployed: Cluster) -> None:
    c = deployed
    run = _name("secret")
    c.hf("run", "probe", "-p", "sleep=300", "--run-name", run, "--nodes", "1", "--detach", check=True, timeout=300)
    log = c.run_dir(0, run) / "logs" / "rank0.log"
    wait_for(lambda: log.exists() and "secret_len=" in log.read_text(), 300, "the probe to print")
    assert f"rank=0 secret_len={len(SECRET)}" in log.read_text()
    name = f"hf-hfrt-probe-{run}-hfnode0"
    inspect = subprocess.run([exe("docker"), "inspect", name], capture_output=True, text=True, check=True).stdout
    assert SECRET not in inspect and json.loads(inspect)[0]["Config"]["OpenStdin"]
    state = c.home(0) / ".hfrt"
    assert _holds_secret(state) == [] and _holds_secret(c.run_dir(0, run)) == []
    c.hf("kill", run, check=True, timeout=60)
    assert _containers(run) == []
    assert _holds_secret(state) == [] and _holds_secret(c.run_dir(0, run)) == []

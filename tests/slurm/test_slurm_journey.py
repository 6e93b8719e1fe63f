"""A user's day on a real Slurm cluster, through the real CLI, with nothing placed by hand (issue 12).

The project's higgsfield.yml has a ``slurm:`` block and no nodes; the login node is
test-bed host hfnode20 (its host key not pinned yet), the workdir a new directory in
its home (which the bed's compute nodes n1..n3 see)::

    higgsfield setup --accept-new-host-keys   # the cluster checked, the workdir read back by a compute node,
                                              # the invoker in <workdir>/venv; a re-run changes nothing
    higgsfield deploy                         # the release + the project environment (torch) in the workdir
    higgsfield doctor --json                  # partitions, idle nodes, the account, the environment
    higgsfield run probe ...             # 2 nodes x 2 gloo ranks, followed: merged node/rank logs, succeeded;
                                              # its data: entry, sent once to the workdir, read by every rank;
                                              # a stale copy refused
    higgsfield run ... --max-restarts 1       # a rank crashes: Slurm requeues the job, it resumes from its checkpoint
    higgsfield run ... --detach; logs -f      # a long run followed live
    higgsfield ci run probe                   # as a workflow does: queued behind it, Slurm's reason shown
    higgsfield status --json; kill; ci kill   # both end killed, nothing left in squeue

The project is the session's (``slurm_project``): the dashboard's tests (test_slurm_ui.py, after this
file) reuse it once this test got through its deploy, rather than set up and deploy one more.

    .venv/bin/python -m pytest tests/slurm/test_slurm_journey.py -s
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from slurm_helpers import (
    DATA_SAYS,
    SECRET,
    SharedProject,
    User,
    by_rank,
    make_project,
    print_timings,
    squeue_names,
)

pytestmark = [pytest.mark.slow, pytest.mark.sshd]


@pytest.fixture
def cluster_project(slurm_project: SharedProject, login: Any, tmp_path: Path) -> Iterator[tuple[User, Path]]:
    """A new project whose config names the cluster, its workdir not created yet: the session's (which the
    dashboard's tests reuse once this deployed it; removed at the session end), or one of its own when a
    test had that one first (removed afterwards). None of its jobs outlives the test."""
    if not slurm_project.claim():
        with make_project(login, tmp_path, "journey") as made:
            yield made
        return
    try:
        yield slurm_project.user, slurm_project.workdir
    finally:
        subprocess.run(["scancel", "-u", login["host"].user], capture_output=True, timeout=60)
        print_timings("journey", slurm_project.user)


@pytest.mark.timeout(900)
def test_setup_deploy_run_logs_status_kill_and_ci_on_slurm(cluster_project: tuple[User, Path],
                                                           slurm_project: SharedProject) -> None:
    user, workdir = cluster_project

    # -- setup: the host key pinned, the cluster checked, the workdir shared, the invoker in it -------
    out = user("setup", "--accept-new-host-keys", timeout=600, timed="setup, fresh login node").stdout
    assert "pinned login's host key" in out, out
    assert (user.cwd / ".higgsfield" / "known_hosts").read_text().count("ssh-ed25519") == 1
    assert (workdir / ".higgsfield-shared").is_file() and (workdir / "venv" / "bin" / "higgsfield").exists()
    assert "every step was already done, nothing changed" in user("setup", timed="setup, re-run").stdout

    # -- deploy: a commit-addressed release and the project environment, in the workdir ---------------
    out = user("deploy", timeout=900, timed="deploy (project environment built)").stderr
    assert re.search(r"login: shipped, environment [0-9a-f]{12}-py3\d+ built", out), out[-3000:]
    code = workdir / "projects" / "lab" / "code"
    assert code.is_symlink() and (code / ".higgsfield-commit").is_file()
    doctor = json.loads(user("doctor", "--json", ok=False).stdout)["nodes"][0]["checks"]
    for name in ("slurm", "partition", "account", "invoker", "environment"):
        assert doctor[name]["ok"], (name, doctor[name])
    assert re.fullmatch(r"debug\*: 3 nodes, \d idle", doctor["partition"]["summary"]), doctor["partition"]
    slurm_project.mark_deployed(user)   # the dashboard's tests may use it from here on

    # -- a run followed to its end: 2 nodes x 2 ranks, merged node/rank logs ----------------------------
    r = user("run", "probe", "--run-name", "first", timeout=300, timed="run, followed (2 nodes x 2)")
    assert "run first started as Slurm job" in r.stderr and "run first succeeded" in r.stderr, r.stderr
    ranks = by_rank(r.stdout)
    assert sorted(ranks) == [0, 1, 2, 3], r.stdout[-3000:]
    assert {ranks[i][0] for i in ranks} == {"n1", "n2"} and ranks[0][0] == ranks[1][0] != ranks[2][0]
    for node, lines in ranks.values():
        assert "all_reduce ok sum=10" in lines and any(f"node={node} secret_len={len(SECRET)}" in t for t in lines)
        assert f"mirror={workdir}/mirror" in lines, lines   # checkpoint.mirror reaches every rank, as on SSH nodes
        # the data: entry deploy sent once to the login node's workdir, read by every rank through its path
        assert any(t.startswith(f"data={workdir}/") and t.endswith(f"says={DATA_SAYS}") for t in lines), lines
    st = user.status()["first"]
    assert (st["state"], st["exit_code"], sorted(st["nodes"])) == ("succeeded", 0, ["n1", "n2"])
    assert by_rank(user("logs", "first").stdout) == ranks
    (user.cwd / "corpus" / "hello.txt").write_text("changed\n")   # the workdir's copy is stale now: refused
    stale = user("run", "probe", "--detach", ok=False)
    assert stale.returncode == 2 and stale.stderr.count("\n") == 1, stale.stderr
    assert "login: data 'corpus' is stale there" in stale.stderr, stale.stderr
    (user.cwd / "corpus" / "hello.txt").write_text(f"{DATA_SAYS}\n")   # as deployed: current again

    # -- a rank crash with --max-restarts 1: the job is requeued and resumes from its checkpoint ------------
    user("run", "probe", "-p", "steps=6", "-p", "crash_at=3", "--max-restarts", "1", "--run-name", "requeued",
         "--detach")
    st = user.wait("requeued", lambda s: s.get("state") in ("succeeded", "failed", "killed"), 240)
    assert st["state"] == "succeeded", st
    assert (st["params"]["steps"], st["params"]["crash_at"]) == (6, 3), st   # status --json: the run's real params
    rank0 = by_rank(user("logs", "requeued").stdout)[0][1]
    assert "resumed at step 0" in rank0 and "resumed at step 3" in rank0, rank0
    assert (workdir / "checkpoints" / "lab" / "requeued" / "step").read_text() == "6"
    steps = [json.loads(ln)["step"] for ln in user("metrics", "requeued", "--json").stdout.splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6], steps   # the curve goes on where the checkpoint left it

    # -- pull through the login node: a step placed in the run's checkpoint dir (the shared workdir) comes home --
    # The step is made the login user's, as a job's save leaves it: placed by this (root) process under the
    # suite's umask, it would not be readable by hfnode20's invoker once an earlier test in the same process
    # left the umask at 0077 (invoker.start.start_run sets it), and the listing would find no step.
    placed = workdir / "checkpoints" / "lab" / "requeued" / "step_00000006"
    placed.mkdir()
    (placed / "__0_0.distcp").write_bytes(bytes(range(256)) * 40)
    (placed / "COMPLETE").write_text(json.dumps({"step": 6, "mode": "shared"}))
    owner = workdir.stat()
    for p in (placed, *placed.iterdir()):
        os.lchown(p, owner.st_uid, owner.st_gid)
    dest = user.cwd / "pulled"
    assert "pulled step_00000006 of requeued from 1 node(s)" in user("pull", "requeued", str(dest), "--logs").stdout
    assert (dest / "step_00000006" / "__0_0.distcp").read_bytes() == (placed / "__0_0.distcp").read_bytes()
    assert json.loads((dest / "step_00000006" / "COMPLETE").read_text())["pulled"]["run"] == "requeued"
    assert list(dest.glob("logs/*/logs/rank0.log")), sorted(str(x) for x in dest.rglob("*"))
    bad = user("pull", "requeued", str(dest), "--step", "3", ok=False)
    assert bad.returncode == 2 and "step_00000003 of run 'requeued' is not complete on" in bad.stderr, bad.stderr

    # -- a long run, followed live by logs -f; a workflow's run queues behind it -------------------------
    t0 = time.monotonic()
    user("run", "probe", "-p", "gate=never", "--run-name", "long", "--detach")
    follower = subprocess.Popen([sys.executable, "-m", "higgsfield", "logs", "long", "-f"], cwd=user.cwd,
                                env=user.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(follower.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    deadline = time.monotonic() + 120
    while sum(" | all_reduce ok" in ln for ln in seen) < 4:
        assert time.monotonic() < deadline and follower.poll() is None, (seen, follower.poll())
        time.sleep(0.2)
    user.timings["run --detach to 4 ranks seen by logs -f"] = round(time.monotonic() - t0, 1)
    assert user.status()["long"]["state"] == "running"

    key = user.cwd.parent / "runner" / "ssh_key"
    key.parent.mkdir()
    shutil.copy(yaml.safe_load((user.cwd / "higgsfield.yml").read_text())["ssh"]["identity_file"], key)
    key.chmod(0o600)   # what a workflow job does with the SSH_KEY secret
    job_env = {**user.env, "HIGGSFIELD_SSH_KEY_FILE": str(key), "HIGGSFIELD_RUN_NAME": "from-ci",
               "HIGGSFIELD_PARAM_gate": "never", "HF_SLURM_SECRET": SECRET}
    ci = user("ci", "run", "probe", env=job_env, timed="ci run (submit)")
    assert "started run 'from-ci' of experiment 'probe' as Slurm job" in ci.stdout, ci.stdout
    queued = user.wait("from-ci", lambda s: s.get("state") == "queued" and s.get("reason"), 60)
    assert queued["reason"] in ("Resources", "Priority"), queued   # 2 + 2 nodes asked of 3

    # -- kill: scancel; the follower ends, the queued run starts, ci kill ends it -----------------------
    t0 = time.monotonic()
    assert "long: killed" in user("kill", "long", timed="kill (running)").stdout
    follower.wait(timeout=60)
    reader.join(timeout=10)
    user.timings["logs -f ends after kill"] = round(time.monotonic() - t0, 1)
    tagged = by_rank("".join(seen))
    assert sorted(tagged) == [0, 1, 2, 3] and {n for n, _ in tagged.values()} <= {"n1", "n2", "n3"}, seen
    assert user.status()["long"]["state"] == "killed"
    user.wait("from-ci", lambda s: s.get("state") == "running", 120)
    k = user("ci", "kill", env={**job_env, "HIGGSFIELD_KILL_TARGET": "from-ci"})
    assert "from-ci: killed" in k.stdout, k.stdout
    runs = user.status()
    assert {n: runs[n]["state"] for n in ("first", "long", "from-ci")} == \
        {"first": "succeeded", "long": "killed", "from-ci": "killed"}
    assert squeue_names() == []

    # secrets: in no file of the workdir, no job script
    for p in workdir.rglob("*"):
        if p.is_file() and "envs" not in p.parts and "venv" not in p.parts and p.stat().st_size < 5_000_000:
            assert SECRET.encode() not in p.read_bytes(), p

    # -- a bad partition is one line, from setup, doctor and run -----------------------------------------
    cfg = yaml.safe_load((user.cwd / "higgsfield.yml").read_text())
    cfg["slurm"]["partition"] = "nope"
    (user.cwd / "higgsfield.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    want = "partition 'nope' does not exist on the cluster (partitions: debug)"
    s = user("setup", ok=False)
    assert s.returncode == 1 and want in s.stdout and "Traceback" not in s.stderr, (s.stdout, s.stderr)
    d = user("doctor", ok=False)
    assert d.returncode == 1 and want in d.stdout, d.stdout
    r = user("run", "probe", "--detach", ok=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Slurm refused run" in r.stderr, r.stderr
    assert "partition" in r.stderr, r.stderr

"""A user's day on a real Slurm cluster, through the real CLI, with nothing placed by hand (issue 12).

The project's higgsfield.yml has a ``slurm:`` block and no nodes; the login node is
test-bed host hfnode20 (its host key not pinned yet), the workdir a new directory in
its home (which the bed's compute nodes n1..n3 see)::

    higgsfield setup --accept-new-host-keys   # the cluster checked, the workdir read back by a compute node,
                                              # the invoker in <workdir>/venv; a re-run changes nothing
    higgsfield deploy                         # the release + the project environment (torch) in the workdir
    higgsfield doctor --json                  # partitions, idle nodes, the account, the environment
    higgsfield run probe ...             # 2 nodes x 2 gloo ranks, followed: merged node/rank logs, succeeded
    higgsfield run ... --detach; logs -f      # a long run followed live
    higgsfield ci run probe                   # as a workflow does: queued behind it, Slurm's reason shown
    higgsfield status --json; kill; ci kill   # both end killed, nothing left in squeue

    .venv/bin/python -m pytest tests/slurm/test_slurm_journey.py -s
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers_project import cli_env
from slurm_helpers import EXPERIMENT, SECRET

pytestmark = [pytest.mark.slow, pytest.mark.sshd]
LINE = re.compile(r"^(n\d)/(\d+) \| (.*)$")


class User:
    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd, self.env = cwd, env
        self.timings: dict[str, float] = {}

    def __call__(self, *args: str, timeout: float = 180, ok: bool = True, timed: str | None = None,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=self.cwd, env=env or self.env,
                           capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if timed:
            self.timings[timed] = round(time.monotonic() - t0, 1)
        if ok and r.returncode != 0:
            raise AssertionError(f"higgsfield {' '.join(args)} exited {r.returncode}\nstdout:\n{r.stdout[-4000:]}"
                                 f"\nstderr:\n{r.stderr[-4000:]}")
        return r

    def status(self) -> dict[str, dict[str, Any]]:
        data = json.loads(self("status", "--json").stdout)
        assert data["unreachable"] == {}
        return {r["run"]: r for r in data["runs"]}

    def wait(self, run: str, pred: Any, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            st = self.status().get(run, {})
            if pred(st):
                return st
            assert time.monotonic() < deadline, f"{run}: {st}"
            time.sleep(1)


def by_rank(out: str) -> dict[int, tuple[str, list[str]]]:
    """rank -> (its node, its lines), from ``node/rank | text`` lines."""
    found: dict[int, tuple[str, list[str]]] = {}
    for ln in out.splitlines():
        m = LINE.match(ln)
        if m:
            found.setdefault(int(m.group(2)), (m.group(1), []))[1].append(m.group(3))
    return found


def squeue_names(timeout: float = 30) -> list[str]:
    """The login user's jobs Slurm still runs, once none is left (or after ``timeout``: what is left)."""
    deadline = time.monotonic() + timeout
    while True:
        names = subprocess.run(["squeue", "-h", "-u", "hfnode20", "-o", "%j"], capture_output=True, text=True,
                               timeout=30).stdout.split()
        if not names or time.monotonic() > deadline:
            return names
        time.sleep(0.5)


@pytest.fixture
def cluster_project(login: Any, tmp_path: Path) -> Iterator[tuple[User, Path]]:
    """A new project whose config names the cluster; its workdir (not created yet) is removed afterwards."""
    h, bed = login["host"], login["bed"]
    pw = pwd.getpwnam(h.user)
    workdir = Path(pw.pw_dir) / f"hf-journey-{uuid.uuid4().hex[:8]}"
    proj = tmp_path / "lab"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "slurmprobe.py").write_text(EXPERIMENT)
    (proj / "requirements.txt").write_text("torch==2.13.0\n")   # the CPU wheel on this machine's disk
    (proj / ".gitignore").write_text("env\n.higgsfield/logs/\n.higgsfield/cache/\n")
    (proj / "env").write_text(f"HF_SLURM_SECRET={SECRET}\n")
    config = {"name": "lab", "secrets": ["HF_SLURM_SECRET"], "nproc_per_node": 2,
              "ssh": {"identity_file": str(bed.client_key), "known_hosts": ".higgsfield/known_hosts"},
              "slurm": {"login": {"host": h.address, "user": h.user, "port": h.port}, "workdir": str(workdir),
                        "partition": "debug", "account": "testlab", "nodes": 2, "time": "5"}}
    (proj / "higgsfield.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = cli_env(tmp_path / "home", PYTHONUNBUFFERED="1", COLUMNS="200", GIT_AUTHOR_NAME="u",
                  GIT_AUTHOR_EMAIL="u@example.com", GIT_COMMITTER_NAME="u", GIT_COMMITTER_EMAIL="u@example.com")
    env.pop("CI", None)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "a project on a cluster"]):
        subprocess.run(["git", *args], cwd=proj, env=env, check=True, capture_output=True, timeout=60)
    user = User(proj, env)
    yield user, workdir
    subprocess.run(["scancel", "-u", h.user], capture_output=True, timeout=60)
    if user.timings:
        print("\nslurm journey timings (s):\n" + "\n".join(f"  {k:<34} {v:6.1f}" for k, v in user.timings.items()))
    if not os.environ.get("HF_SLURM_KEEP"):
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.timeout(900)
def test_setup_deploy_run_logs_status_kill_and_ci_on_slurm(cluster_project: tuple[User, Path]) -> None:
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

    # -- a run followed to its end: 2 nodes x 2 ranks, merged node/rank logs ----------------------------
    r = user("run", "probe", "--run-name", "first", timeout=300, timed="run, followed (2 nodes x 2)")
    assert "run first started as Slurm job" in r.stderr and "run first succeeded" in r.stderr, r.stderr
    ranks = by_rank(r.stdout)
    assert sorted(ranks) == [0, 1, 2, 3], r.stdout[-3000:]
    assert {ranks[i][0] for i in ranks} == {"n1", "n2"} and ranks[0][0] == ranks[1][0] != ranks[2][0]
    for node, lines in ranks.values():
        assert "all_reduce ok sum=10" in lines and any(f"node={node} secret_len={len(SECRET)}" in t for t in lines)
    st = user.status()["first"]
    assert (st["state"], st["exit_code"], sorted(st["nodes"])) == ("succeeded", 0, ["n1", "n2"])
    assert by_rank(user("logs", "first").stdout) == ranks

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

"""The user's journey on fresh nodes, through the real CLI, with nothing placed by hand (issue 9).

Three fresh test-bed hosts of this test's own (hfnode4-6 on 127.0.0.6-8:2222: homes
wiped, users out of the docker group). Then, as a user types it::

    higgsfield init journey; edit higgsfield.yml + requirements.txt; git commit
    higgsfield setup                  # fresh nodes: docker group, invoker, deploy key
    higgsfield deploy                 # docker: the image on every node
    higgsfield run example            # 3 nodes x 2 processes, logs, status, kill of a long run
    runtime: process -> deploy        # a venv per node, keyed by requirements.txt
    higgsfield doctor; run; logs; status; kill
    a fresh venv: pip install <a copy of this checkout with one module added>   (no index for higgsfield)
    setup (the invoker from that build) -> deploy -> run, in both runtimes: the added module reaches
    every rank (a probe run, then kill; training was shown above, so it is not repeated)

One setup serves the first two variants (the nodes don't change); the checkout variant
re-runs setup because its control side is another build. Timings are printed (``-s``)
for docs/benchmarks.md.

    .venv/bin/python -m pytest tests/journey/test_journey.py -s
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runs"))  # runs_helpers (tests/ has no packages)
from runs_helpers import lines_by_rank, wait_for  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.sshd, pytest.mark.docker]

REPO = Path(__file__).resolve().parents[2]
INDICES = (4, 5, 6)  # this test's own hosts: the shared hfnode0-3 are never touched
NODES = [f"hfnode{i}" for i in INDICES]
PROJECT = "journey"
STATE = ".hfjourney"

PROBE = '''\
"""Says which higgsfield and python a rank runs with, then waits (a long run to kill)."""
import os
import sys
import time

import higgsfield
from higgsfield.experiment import experiment, param


@experiment("probe")
@param("seconds", default=0.0, description="How long to wait before ending.")
def probe(params):
    try:
        from higgsfield import _journey_marker
        marker = _journey_marker.TOKEN
    except ImportError:
        marker = "none"
    where = os.path.dirname(higgsfield.__file__)
    print(f"probe rank={params.rank} world={params.world_size} marker={marker} higgsfield={where} "
          f"python={sys.executable}", flush=True)
    end = time.time() + params.seconds
    while time.time() < end:
        time.sleep(0.2)
'''


# -- the test bed ----------------------------------------------------------------------

def _bed() -> Any:
    """The test bed's implementation (scripts/testbed/testbed.py), loaded once by tests/testbed.py."""
    import testbed

    return testbed.impl


def _exe(name: str) -> str:
    return shutil.which(name) or name


def _end_user_processes(user: str) -> None:
    """End what an earlier journey left running as this test's own node users (by pid)."""
    import psutil

    uid = pwd.getpwnam(user).pw_uid
    procs = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    psutil.wait_procs(procs, timeout=10)


def _remove_project_containers() -> None:
    ids = subprocess.run([_exe("docker"), "ps", "-aq", "--filter", f"label=org.higgsfield.project={PROJECT}"],
                         capture_output=True, text=True, timeout=60).stdout.split()
    if ids:
        subprocess.run([_exe("docker"), "rm", "-f", *ids], capture_output=True, timeout=120)


def _remove_project_images() -> None:
    tags = subprocess.run([_exe("docker"), "images", "--format", "{{.Repository}}:{{.Tag}}", f"hf-{PROJECT}"],
                          capture_output=True, text=True, timeout=60).stdout.split()
    if tags:
        subprocess.run([_exe("docker"), "image", "rm", "-f", *tags], capture_output=True, timeout=120)


@pytest.fixture
def fresh_nodes() -> Iterator[Any]:
    """hfnode4-6 as a new user gets them: accounts with sshd, sudo and an authorized key; nothing else."""
    if os.geteuid() != 0:
        pytest.skip("the test bed needs root")
    tb = _bed()
    if not tb.docker_answers() or not tb.image_exists(tb.BASE_IMAGE):
        pytest.skip("test bed not up (dockerd + base image): python3 scripts/testbed/testbed.py up")
    sdir = tb.state_dir()
    pub = tb.ensure_client_key(sdir).with_suffix(".pub").read_text().strip()
    hosts = [tb.make_host(i) for i in INDICES]
    _remove_project_containers()
    _remove_project_images()  # so this journey's deploy really builds its image
    for h in hosts:
        tb.ensure_user(h, pub)
        _end_user_processes(h.user)
        tb.reset_home(h)
        tb.remove_from_docker_group(h)
        tb.start_host(h)
    tb.journey_done = False
    yield tb
    _remove_project_containers()
    _remove_project_images()
    if not tb.journey_done:  # a failed journey leaves the nodes' state (run logs, records) to look at
        return
    for h in hosts:  # the venvs and invokers take ~1 GB per node: give the disk back
        _end_user_processes(h.user)
        tb.reset_home(h)
        tb.remove_from_docker_group(h)


# -- the user ------------------------------------------------------------------------

@dataclass
class User:
    """Types higgsfield commands in a project directory (a subprocess each, as in a shell)."""

    cli: list[str]
    cwd: Path
    env: dict[str, str]
    timings: dict[str, float] = field(default_factory=dict)

    def __call__(self, *args: str, timeout: float = 300, ok: bool = True, timed: str | None = None,
                 cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        t0 = time.monotonic()
        r = subprocess.run([*self.cli, *args], cwd=cwd or self.cwd, env=self.env, capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
        if timed:
            self.timings[timed] = round(time.monotonic() - t0, 1)
        if ok and r.returncode != 0:
            out = r.stdout if len(r.stdout) <= 6000 else r.stdout[:2000] + "\n[...]\n" + r.stdout[-4000:]
            raise AssertionError(f"higgsfield {' '.join(args)} exited {r.returncode} (node state kept under "
                                 f"/home/hfnode4-6/{STATE})\nstdout:\n{out}\nstderr:\n{r.stderr[-4000:]}")
        return r

    def git(self, *args: str) -> None:
        subprocess.run([_exe("git"), *args], cwd=self.cwd, env=self.env, check=True, capture_output=True,
                       timeout=60)

    def commit(self, message: str) -> None:
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)

    def edit_config(self, **changes: Any) -> None:
        path = self.cwd / "higgsfield.yml"
        head = path.read_text().splitlines()[0]  # the schema comment stays
        data = yaml.safe_load(path.read_text())
        data.update(changes)
        path.write_text(head + "\n" + yaml.safe_dump(data, sort_keys=False))


def _home(node: str) -> Path:
    return Path("/home") / node


def _status(user: User) -> dict[str, dict[str, Any]]:
    r = user("status", "--json", timeout=120)
    data = json.loads(r.stdout)
    assert data["unreachable"] == {}, data["unreachable"]
    return {x["run"]: x for x in data["runs"]}


def _run_record(node: str, run: str) -> dict[str, Any]:
    return json.loads((_home(node) / STATE / "runs" / PROJECT / run / "run.json").read_text())


def _run_pids(node: str, run: str) -> list[int]:
    """Processes (any namespace, containers included) whose environment names this run's directory."""
    needle = f"HIGGSFIELD_RUN_DIR={_home(node) / STATE / 'runs' / PROJECT / run}".encode()
    found = []
    for e in os.listdir("/proc"):
        if e.isdigit():
            with contextlib.suppress(OSError):
                if needle in Path(f"/proc/{e}/environ").read_bytes().split(b"\0"):
                    found.append(int(e))
    return found


def _train_run_logs_status(user: User, runtime: str, label: str) -> str:
    """``run example`` in the foreground on 3 nodes x 2 processes, then ``logs`` and ``status`` of it."""
    run = f"ex-{label}-{uuid.uuid4().hex[:4]}"
    r = user("run", "example", "-p", "steps=30", "--run-name", run, timeout=600, timed=f"run example ({label})")
    assert f"run {run} succeeded" in r.stderr, r.stderr[-3000:]
    assert "done: 6 process(es) on cpu" in r.stdout, r.stdout[-3000:]
    losses = [float(ln.split()[-1]) for ln in r.stdout.splitlines() if re.search(r"\| step +\d+ +loss ", ln)]
    assert len(losses) == 4 and losses[-1] < losses[0], losses  # steps 1, 10, 20, 30: the loss goes down

    logs = user("logs", run, timeout=120).stdout
    by = lines_by_rank(logs)
    assert {k[0] for k in by} == set(NODES), sorted(by)
    assert [t for t in by[("hfnode4", "0")] if t.startswith("step")] == \
        [t for t in lines_by_rank(r.stdout)[("hfnode4", "0")] if t.startswith("step")]
    assert any(t.startswith("done: 6 process(es)") for t in by[("hfnode4", "0")])

    table = user("status", timeout=120).stdout
    assert run in table and "succeeded" in table
    st = _status(user)[run]
    assert st["state"] == "succeeded" and st["exit_code"] == 0 and st["nodes"] == NODES
    for i, node in enumerate(NODES):
        rec = _run_record(node, run)
        assert rec["runtime"] == runtime and rec["nnodes"] == 3 and rec["nproc"] == 2 and rec["node_rank"] == i
    return run


def _probe_and_kill(user: User, runtime: str, label: str, marker: str = "none") -> list[str]:
    """A long ``probe`` run, detached: every rank reports its higgsfield, then ``kill`` stops it everywhere."""
    run = f"long-{label}-{uuid.uuid4().hex[:4]}"
    user("run", "probe", "-p", "seconds=600", "--run-name", run, "--detach", timeout=300)

    def reported() -> bool:   # the nodes' rank logs on their disks: a `logs` a poll is a CLI and 3 SSH sessions
        logs = [p for node in NODES for p in (_home(node) / STATE / "runs" / PROJECT / run / "logs").glob("rank*.log")]
        return sum("probe rank=" in p.read_text(errors="replace") for p in logs) == 6

    wait_for(reported, 240, f"the 6 ranks of {run} to report", poll=0.5)
    lines = [t for t in user("logs", run, timeout=120).stdout.splitlines() if " | probe rank=" in t]
    assert len(lines) == 6, lines
    assert all(f"marker={marker} " in ln and "world=6" in ln for ln in lines), lines
    assert _status(user)[run]["state"] == "running"
    t0 = time.monotonic()
    r = user("kill", run, timeout=120, timed=f"kill ({label})")
    assert f"{run}: killed" in r.stdout, r.stdout
    assert time.monotonic() - t0 < 30
    st = _status(user)[run]
    assert st["state"] == "killed", st
    for node in NODES:
        assert _run_record(node, run)["runtime"] == runtime
        wait_for(lambda n=node: not _run_pids(n, run), 30, f"no process of {run} left on {node}", poll=0.5)
    left = subprocess.run([_exe("docker"), "ps", "-aq", "--filter", f"label=org.higgsfield.run={run}"],
                          capture_output=True, text=True, timeout=60).stdout.split()
    assert left == [], f"containers of {run} left: {left}"
    return lines


def _setup(user: User, label: str) -> subprocess.CompletedProcess[str]:
    flags = []
    # setup is the only command that pins host keys; with the flag, it does so without a prompt
    if "--accept-new-host-keys" in user("setup", "--help", timeout=60).stdout:
        flags.append("--accept-new-host-keys")
    return user("setup", *flags, timeout=1200, timed=label)


def _copy_checkout(dest: Path, token: str) -> Path:
    """A clone's worth of this repository (its committed tree), plus a module no published release has."""
    dest.mkdir(parents=True)
    archive = subprocess.run([_exe("git"), "archive", "--format=tar", "HEAD"], cwd=REPO, capture_output=True,
                             check=True, timeout=120).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (dest / "higgsfield" / "_journey_marker.py").write_text(
        f'"""Only in this test\'s build of higgsfield: shows that build reached the run."""\nTOKEN = "{token}"\n')
    return dest


@pytest.mark.timeout(1800)
def test_journey_on_fresh_nodes_docker_process_and_a_checkout(fresh_nodes: Any, tmp_path: Path) -> None:
    tb = fresh_nodes
    key = tb.ensure_client_key(tb.state_dir())
    env = {k: v for k, v in os.environ.items() if k not in ("HIGGSFIELD_DEBUG", "CI")}
    env.update({"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "PYTHONUNBUFFERED": "1", "COLUMNS": "200",
                "GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@example.com",
                "GIT_COMMITTER_NAME": "u", "GIT_COMMITTER_EMAIL": "u@example.com"})
    user = User([sys.executable, "-m", "higgsfield"], tmp_path / PROJECT, env)
    try:
        _journey(tb, user, key, env, tmp_path)
        tb.journey_done = True
    finally:
        if user.timings:
            width = max(len(k) for k in user.timings)
            print("\njourney timings (s):\n"
                  + "\n".join(f"  {k:<{width}}  {v:7.1f}" for k, v in user.timings.items()))


def _journey(tb: Any, user: User, key: Path, env: dict[str, str], tmp_path: Path) -> None:

    # -- init, then the user's edits ----------------------------------------------------
    user("init", PROJECT, cwd=tmp_path, timeout=120)
    for name in ("higgsfield.yml", "Dockerfile", "requirements.txt", "src/example.py"):
        assert (user.cwd / name).is_file(), name
    user.edit_config(
        nodes=[{"host": f"127.0.0.{i + 2}", "name": f"hfnode{i}", "user": f"hfnode{i}"} for i in INDICES],
        ssh={"port": 2222, "identity_file": str(key), "known_hosts": ".higgsfield/known_hosts",
             "connect_timeout": 10},
        nproc_per_node=2, runtime="docker", state_dir=f"~/{STATE}",
        docker={"base_image": tb.BASE_IMAGE})  # no registry here: the bed's offline image (python + torch)
    # the CPU build of torch that this machine's pip has on disk (a plain `torch` would be a CUDA build)
    import testbed

    with (user.cwd / "requirements.txt").open("a") as f:
        # (the comment makes this journey's image new to the shared engine, so deploy really builds it)
        f.write(testbed.cpu_torch_requirements(tb.state_dir()).rstrip("\n") + f"  # journey {uuid.uuid4().hex[:8]}\n")
    (user.cwd / "src" / "probe.py").write_text(PROBE)
    user.git("init", "-q", "-b", "main")
    user.commit("a new project")
    user("config", "check", timeout=60)

    # -- setup on fresh nodes -------------------------------------------------------------
    for node in NODES:
        assert not tb.in_docker_group(node) and not (_home(node) / STATE).exists()
    out = _setup(user, "setup, fresh (3 nodes)")
    for node in NODES:
        assert tb.in_docker_group(node), f"setup did not put {node} in the docker group"
        assert (_home(node) / STATE / "venv" / "bin" / "higgsfield").exists()
    assert (user.cwd / ".higgsfield" / "known_hosts").read_text().count("ssh-ed25519") == 3
    assert "failed" not in out.stdout.lower(), out.stdout[-3000:]

    # -- docker ---------------------------------------------------------------------------
    out = user("deploy", timeout=1200, timed="deploy, docker (3 image builds)")
    tags = set(re.findall(r"image (hf-journey:[0-9a-f]{12}) built", out.stderr))
    assert len(tags) == 1, out.stderr[-3000:]
    tag = tags.pop()
    # the image holds no higgsfield (so none came from an index): runs mount the invoker's package
    r = subprocess.run([_exe("docker"), "run", "--rm", tag, "python", "-c",
                        "import importlib.util as u; print(u.find_spec('higgsfield'), u.find_spec('torch') is not None)"],
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["None", "True"], r.stdout + r.stderr
    for node in NODES:   # each node listed its own image's packages once, for the drift check
        img = json.loads((_home(node) / STATE / "projects" / PROJECT / "image.json").read_text())
        assert img["tag"] == tag and img["packages"]["torch"] == f"{tb.TORCH_VERSION}+cpu", img
    _train_run_logs_status(user, "docker", "docker")
    lines = _probe_and_kill(user, "docker", "docker")
    assert all("higgsfield=/opt/higgsfield-invoker/higgsfield " in ln for ln in lines), lines

    # -- the same project, runtime: process -----------------------------------------------
    user.edit_config(runtime="process")
    user.commit("plain processes")
    out = user("deploy", timeout=1200, timed="deploy, process (3 venvs built)")
    for node in NODES:  # the per-node progress, then the result
        assert re.search(rf"{node}: environment: installing 1 requirement\(s\) from requirements.txt", out.stderr)
        # the CPU build from the bed's disk: PyPI's CUDA build is about 5 GiB per node and has filled CI's disk
        assert re.search(rf"{node}: environment: ready: torch {re.escape(tb.TORCH_VERSION)}\+cpu", out.stderr)
        assert re.search(rf"{node}: shipped, environment [0-9a-f]{{12}}-py3\d+ built", out.stderr), out.stderr
    envs = {node: json.loads((_home(node) / STATE / "projects" / PROJECT / "env.json").read_text()) for node in NODES}
    assert len({e["key"] for e in envs.values()}) == 1
    out = user("deploy", timeout=600, timed="deploy, process (unchanged)")
    assert out.stderr.count("environment: unchanged") == 3, out.stderr
    doctor = user("doctor", "--json", timeout=300, ok=False)  # other checks may warn (disk, clock): not ours
    checks = {n["node"]: n["checks"].get("environment") for n in json.loads(doctor.stdout)["nodes"]}
    for node in NODES:
        assert checks[node] and checks[node]["ok"] and checks[node]["data"]["state"] == "present", checks
        assert checks[node]["data"]["key"] == envs[node]["key"]
    assert "environment" in user("doctor", timeout=300, ok=False).stdout  # the table shows it too
    _train_run_logs_status(user, "process", "process")
    lines = _probe_and_kill(user, "process", "process")
    for node in NODES:
        python = envs[node]["python"]
        assert python.startswith(str(_home(node) / STATE / "envs" / PROJECT)), python
        assert any(f"python={python}" in ln and f"higgsfield={Path(python).parents[1]}/higgsfield-invoker/higgsfield"
                   in ln for ln in lines if ln.startswith(f"{node}/")), lines

    # -- a control side installed from a checkout (non-editable, not from an index) ---------
    token = uuid.uuid4().hex
    checkout = _copy_checkout(tmp_path / "checkout", token)
    venv = tmp_path / "control-venv"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(checkout)],
                         capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-3000:]
    user.timings["pip install <checkout> (control side)"] = round(time.monotonic() - t0, 1)
    fork = User([str(venv / "bin" / "higgsfield")], user.cwd, env, user.timings)
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import higgsfield; print(higgsfield.__file__)"],
                           capture_output=True, text=True, check=True, timeout=60, cwd=tmp_path).stdout
    assert where.startswith(str(venv)), where  # the installed copy, not this checkout
    out = _setup(fork, "setup, invoker from the checkout")
    for node in NODES:
        r = subprocess.run([str(_home(node) / STATE / "venv" / "bin" / "python"), "-I", "-c",  # -I: not ./higgsfield
                            "import higgsfield._journey_marker as m; print(m.TOKEN)"],
                           capture_output=True, text=True, timeout=60)
        assert r.stdout.strip() == token, f"{node}: {r.stdout} {r.stderr}"
    out = fork("deploy", timeout=600, timed="deploy, process (after the invoker changed)")
    assert out.stderr.count("environment: unchanged") == 3, out.stderr
    # training itself was shown above in both runtimes; here the point is which build the ranks run
    _probe_and_kill(fork, "process", "checkout-process", marker=token)
    fork.edit_config(runtime="docker")
    fork.commit("back to docker")
    out = fork("deploy", timeout=600, timed="deploy, docker (image unchanged)")
    assert out.stderr.count(f"image {tag} unchanged") == 3, out.stderr
    _probe_and_kill(fork, "docker", "checkout-docker", marker=token)


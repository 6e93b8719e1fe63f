"""Fixtures for multi-node runs on the real test bed (sshd hosts hfnode0..2, dockerd, the base image).

- ``bed``: the test bed (``scripts/testbed/testbed.py``), skipped when it is not up.
- ``cluster``: a git project with 3 nodes, ``runtime: docker``, the base image as
  ``BASE_IMAGE``, its own state dir ``~/.hfrt`` on each node, and the invoker installed
  for every node user: one shared venv (editable install of this repo, torch and the
  control deps through the machine's pip configuration) linked as
  ``~/.hfrt/venv`` (what ``higgsfield setup`` will do with a wheel). Each node user is
  put in the docker group, as setup does.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from runs_helpers import SECRET, STATE, Cluster, exe
from testbed import shared_node_venv

REPO = Path(__file__).resolve().parents[2]
NODES = 3
SYSTEM_PYTHON = "/usr/bin/python3"


def _load_bed():  # type: ignore[no-untyped-def]
    """The test bed's implementation (scripts/testbed/testbed.py), loaded once by tests/testbed.py."""
    import testbed

    return testbed.impl


@pytest.fixture(scope="session")
def bed():  # type: ignore[no-untyped-def]
    if os.geteuid() != 0:
        pytest.skip("the test bed needs root")
    tb = _load_bed()
    st = tb.status()
    up = [h for h in st["hosts"] if h["up"]]
    if len(up) < NODES or not st["dockerd"]["answers"] or not st["images"].get(tb.BASE_IMAGE):
        pytest.skip("test bed not up: python3 scripts/testbed/testbed.py up")
    return tb


def _install_invoker(tb, venv: Path, i: int) -> None:  # type: ignore[no-untyped-def]
    host = tb.make_host(i)
    pw = pwd.getpwnam(host.user)
    state = host.home / STATE
    state.mkdir(exist_ok=True)
    os.chown(state, pw.pw_uid, pw.pw_gid)
    link = state / "venv"
    if not link.is_symlink() or os.readlink(link) != str(venv):
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(venv)
    tb.add_to_docker_group(host)


PROBE = '''\
"""Prints what reaches a run (the length of its secret, never the value), then waits, and can fail.

sleep: seconds to run; gate: run until the file RUN_DIR/<gate> exists instead (the test's switch);
fail_rank/fail_after/how: that rank fails after that many seconds, by an exception (raise), a
SIGABRT (abort) or a SIGKILL (kill9, as the OOM killer does). No collective (the other ranks would
run on unless higgsfield stops them), unless allreduce: then every rank all-reduces each 0.1 s, and
how=raise_slow_exit raises, then ends its process group once its error is on record (the others'
all_reduce breaks) and keeps its process 5 s more: a node whose torchrun ends later than the nodes it broke.
"""
import os
import signal
import threading
import time
from pathlib import Path

from higgsfield.experiment import experiment, param


def _slow_exit(rank):
    """Once the rank's error is on record (however loaded the machine), break the others, then linger."""
    import torch.distributed as dist

    error = Path(os.environ["HIGGSFIELD_RUN_DIR"]) / "logs" / f"rank{rank}.error.json"
    deadline = time.time() + 30
    while not error.exists() and time.time() < deadline:
        time.sleep(0.05)
    dist.destroy_process_group()
    time.sleep(5)


@experiment("probe")
@param("sleep", default=0.0)
@param("gate", default="")
@param("fail_rank", default=-1)
@param("fail_after", default=3.0)
@param("how", default="raise", options=["raise", "abort", "kill9", "raise_slow_exit"])
@param("allreduce", default=False)
def probe(params):
    print(f"rank={params.rank} secret_len={len(os.environ.get('HF_TEST_SECRET', ''))}", flush=True)
    gate = Path(os.environ["HIGGSFIELD_RUN_DIR"]) / params.gate if params.gate else None
    if params.allreduce:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
    start = time.time()
    while True:
        if params.rank == params.fail_rank and time.time() - start >= params.fail_after:
            print(f"rank {params.rank} fails now ({params.how})", flush=True)
            if params.how == "abort":
                os.abort()
            if params.how == "kill9":
                os.kill(os.getpid(), signal.SIGKILL)
            if params.how == "raise_slow_exit":
                threading.Thread(target=_slow_exit, args=(params.rank,)).start()   # not a daemon: the worker's exit waits for it
            raise RuntimeError(f"probe failure on rank {params.rank}")
        done = gate.exists() if gate is not None else time.time() - start >= params.sleep
        if done:
            return
        if params.allreduce:
            dist.all_reduce(torch.ones(1))
        time.sleep(0.1)
'''


DOCKERFILE = """\
# The test project's training image: the bed's offline base image (python, torch, deps).
ARG BASE_IMAGE=higgsfield-testbase:torch2.13
FROM ${BASE_IMAGE}
COPY requirements.txt /tmp/requirements.txt
ENV PYTHONUNBUFFERED=1
"""


def _git(d: Path, *args: str) -> None:
    subprocess.run([exe("git"), *args], cwd=d, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


def make_cluster(bed, directory: Path, indices: tuple[int, ...]) -> Cluster:  # type: ignore[no-untyped-def]
    """A git project at ``directory`` (its name is the project's) on hosts ``indices`` of the bed, invoker linked."""
    venv = shared_node_venv(bed.state_dir(), SYSTEM_PYTHON)
    for i in indices:
        _install_invoker(bed, venv, i)
    d = directory
    (d / "src").mkdir(parents=True)
    (d / "src" / "regression.py").write_text((REPO / "src" / "regression.py").read_text())
    (d / "src" / "probe.py").write_text(PROBE)
    key = bed.state_dir() / "client" / "id_ed25519"
    nodes = "".join(f"  - host: 127.0.0.{i + 2}\n    name: hfnode{i}\n    user: hfnode{i}\n" for i in indices)
    (d / "higgsfield.yml").write_text(
        f"name: {d.name}\n"
        f"nodes:\n{nodes}"
        "ssh:\n"
        "  port: 2222\n"
        f"  identity_file: {key}\n"
        "  known_hosts: .higgsfield/known_hosts\n"
        "  connect_timeout: 5\n"
        "  retries: 1\n"
        "nproc_per_node: 1\n"
        "runtime: docker\n"
        "secrets: [HF_TEST_SECRET]\n"
        f"state_dir: ~/{STATE}\n"
        "docker:\n"
        f"  base_image: {bed.BASE_IMAGE}\n")
    (d / "Dockerfile").write_text(DOCKERFILE)
    (d / "requirements.txt").write_text("# nothing beyond the base image\n")
    (d / ".gitignore").write_text("env\n.higgsfield/\n")
    (d / "env").write_text(f"HF_TEST_SECRET={SECRET}\n")   # git-ignored: every run of the cluster carries it
    (d / "env").chmod(0o600)
    # pinned as `higgsfield setup` leaves it (no other command trusts a new host): the bed's real host keys
    (d / ".higgsfield").mkdir()
    (d / ".higgsfield" / "known_hosts").write_text(
        "".join(bed.known_hosts_line(bed.make_host(i)) + "\n" for i in indices))
    _git(d, "init", "-q", "-b", "main")
    _git(d, "add", "-A")
    _git(d, "commit", "-q", "-m", "test project")
    return Cluster(d, bed, [f"hfnode{i}" for i in indices])


@pytest.fixture(scope="session")
def cluster(bed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    c = make_cluster(bed, tmp_path_factory.mktemp("cluster") / "hfrt", tuple(range(NODES)))
    yield c
    for i in range(NODES):  # a host a test stopped comes back for the next session
        with_host = bed.make_host(i)
        if not bed.host_running(with_host):
            bed.start_host(with_host)
    # each session builds its own tag (see the deploy test): drop them, the base image stays cached
    tags = subprocess.run([exe("docker"), "images", "--format", "{{.Repository}}:{{.Tag}}", "hf-hfrt"],
                          capture_output=True, text=True).stdout.split()
    if tags:
        subprocess.run([exe("docker"), "image", "rm", "-f", *tags], capture_output=True)


@pytest.fixture(scope="session")
def deployed(cluster: Cluster) -> Cluster:
    cluster.hf("deploy", check=True, timeout=900)
    return cluster


@pytest.fixture(autouse=True)
def _docker_group(request: pytest.FixtureRequest) -> None:
    """Other tests share the bed and may take node users out of the docker group (setup's job): put them back."""
    if "cluster" in request.fixturenames or "deployed" in request.fixturenames:
        tb = request.getfixturevalue("bed")
        for i in range(NODES):
            tb.add_to_docker_group(tb.make_host(i))

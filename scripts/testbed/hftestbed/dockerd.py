"""The shared Docker engine: reuse one that answers, else start dockerd without a bridge network.

Containers run with ``--network host``, so dockerd needs no bridge and no iptables.
A stray DOCKER_HOST or context never redirects the bed to another engine.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from .base import TestbedError, exe
from .procs import kill_and_wait, pid_alive, pid_cmdline, read_pid, spawn_daemon
from .users import ensure_docker_group

DOCKER_SOCKET = "/var/run/docker.sock"

DOCKERD_WAIT_S = 90


def docker_answers(timeout: float = 10) -> bool:
    try:
        p = subprocess.run([exe("docker"), "info", "--format", "{{.ServerVersion}}"],
                           capture_output=True, text=True, timeout=timeout, env=docker_env())
    except (subprocess.TimeoutExpired, FileNotFoundError):
        return False
    return p.returncode == 0 and bool(p.stdout.strip())


def docker_env() -> dict:
    # a stray DOCKER_HOST/CONTEXT must not redirect us to some other engine
    env = {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST", "DOCKER_CONTEXT")}
    env["DOCKER_HOST"] = f"unix://{DOCKER_SOCKET}"
    return env


def dockerd_pid(sdir: Path) -> int | None:
    pid = read_pid(sdir / "dockerd.pid")
    if pid and pid_alive(pid) and (pid_cmdline(pid)[:1] or [""])[0].endswith("dockerd"):
        return pid
    return None


def ensure_dockerd(sdir: Path) -> str:
    if docker_answers():
        ours = dockerd_pid(sdir)
        return f"reusing running dockerd (pid {ours}, ours)" if ours else \
            "reusing running dockerd (not started by the test bed)"
    ensure_docker_group()
    pid = dockerd_pid(sdir)
    if pid is None:
        # a dockerd that died leaves its pid file; a live stranger would make it refuse
        stale = read_pid(Path("/var/run/docker.pid"))
        if stale and not pid_alive(stale):
            Path("/var/run/docker.pid").unlink(missing_ok=True)
        pid = spawn_daemon(["dockerd", "--bridge=none", "--iptables=false",
                            "--host", f"unix://{DOCKER_SOCKET}"], sdir / "dockerd.log")
        (sdir / "dockerd.pid").write_text(f"{pid}\n")
    deadline = time.monotonic() + DOCKERD_WAIT_S
    while time.monotonic() < deadline:
        if docker_answers(timeout=5):
            return f"started dockerd (pid {pid})"
        if not pid_alive(pid):
            break
        time.sleep(0.5)
    if docker_answers(timeout=5):  # ours lost a race with an engine someone else started
        (sdir / "dockerd.pid").unlink(missing_ok=True)
        return "reusing running dockerd (started concurrently, not by the test bed)"
    tail = (sdir / "dockerd.log").read_text()[-3000:] if (sdir / "dockerd.log").exists() else ""
    raise TestbedError(f"dockerd did not answer (pid {pid}); log tail:\n{tail}")


def stop_dockerd(sdir: Path) -> bool:
    pid = dockerd_pid(sdir)
    if not pid:
        (sdir / "dockerd.pid").unlink(missing_ok=True)
        return False
    kill_and_wait(pid, timeout=30)
    (sdir / "dockerd.pid").unlink(missing_ok=True)
    return True

"""Processes and ports: run a command, find, watch and stop a daemon, probe a loopback port.

The bed starts daemons (sshd, dockerd) that outlive the command that started them,
so it tracks them by pid and command line in /proc rather than as children. Every
address it probes is checked to be loopback first: nothing outside 127.0.0.0/8 is
ever a target.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .base import TestbedError, exe, log


def run(argv: Sequence[object], *, check: bool = True, capture: bool = False,
        input: str | bytes | None = None, env: dict | None = None,
        timeout: float | None = None, quiet: bool = False) -> subprocess.CompletedProcess:
    if not quiet:
        log("$ " + " ".join(shlex.quote(str(a)) for a in argv))
    text = not isinstance(input, bytes)
    p = subprocess.run([str(a) for a in argv], check=False, text=text, input=input,
                       stdout=subprocess.PIPE if capture else None,
                       stderr=subprocess.PIPE if capture else None,
                       env=env, timeout=timeout)
    if check and p.returncode != 0:
        detail = ""
        if capture:
            detail = f"\nstdout: {p.stdout}\nstderr: {p.stderr}"
        raise TestbedError(f"command failed (rc={p.returncode}): {' '.join(map(str, argv))}{detail}")
    return p


def run_timestamped(argv: Sequence[object], env: dict | None = None) -> None:
    """Run argv, echoing its output to stderr with elapsed-time prefixes."""
    log("$ " + " ".join(shlex.quote(str(a)) for a in argv))
    t0 = time.monotonic()
    p = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, env=env, text=True, errors="replace")
    assert p.stdout is not None
    tail: list[str] = []
    for line in p.stdout:
        sys.stderr.write(f"  [{time.monotonic() - t0:6.1f}s] {line}")
        tail = (tail + [line])[-40:]
    if p.wait() != 0:
        raise TestbedError(f"command failed (rc={p.returncode}): {' '.join(map(str, argv))}\n"
                           + "".join(tail))


def pid_alive(pid: int) -> bool:
    """True if pid runs and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def pid_cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def child_pids(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            kids.append(int(entry))
    return kids


def kill_and_wait(pid: int, timeout: float = 15.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)  # reap if it happens to be ours
                return
            time.sleep(0.05)
    raise TestbedError(f"process {pid} would not die")


def spawn_daemon(argv: Sequence[object], logfile: Path, env: dict | None = None) -> int:
    """Start argv detached (own session, reparented to init); return its pid."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    script = 'setsid "$@" >>"$TESTBED_LOG" 2>&1 </dev/null & echo $!'
    e = dict(env or os.environ)
    e["TESTBED_LOG"] = str(logfile)
    out = subprocess.run([exe("sh"), "-c", script, "sh", *map(str, argv)], env=e,
                         stdout=subprocess.PIPE, text=True, check=True).stdout
    return int(out.strip())


def check_loopback(address: str) -> None:
    if not ipaddress.ip_address(address).is_loopback:
        raise TestbedError(f"refusing non-loopback target {address}")


def port_open(address: str, port: int, timeout: float = 1.0) -> bool:
    check_loopback(address)
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def ssh_banner(address: str, port: int, timeout: float = 2.0) -> bool:
    """True if an SSH server answers on address:port."""
    check_loopback(address)
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def port_bound(address: str, port: int) -> bool:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT leftovers
    try:
        s.bind((address, port))
        return False
    except OSError:
        return True
    finally:
        s.close()

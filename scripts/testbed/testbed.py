#!/usr/bin/env python3
"""The higgsfield test bed: real sshd hosts, a real Docker engine, an offline base image.

Stdlib only; runs as root on a Debian bookworm machine (local or CI).

    python3 scripts/testbed/testbed.py up [--hosts N] [--no-docker] [--no-image] [--reset-homes]
    python3 scripts/testbed/testbed.py down [--purge]
    python3 scripts/testbed/testbed.py status
    python3 scripts/testbed/testbed.py start-host I | stop-host I | rekey-host I
    python3 scripts/testbed/testbed.py docker-group add|remove I
    python3 scripts/testbed/testbed.py env        # shell exports describing the bed

Everything is idempotent: `up` installs what is missing, (re)starts sshd daemons
and dockerd that are not running, and skips the image build when the image is
already in the engine. State (keys, configs, pids, logs) lives in $TESTBED_DIR,
default <repo>/.testbed.

Host i is unix user hfnode{i}, with its own sshd on 127.0.0.{i+2}:2222. Nothing
outside 127.0.0.0/8 is ever a target: addresses are checked before use.

The tests import this file through tests/testbed.py (the Python API lives here
so that the CLI and the tests share one implementation).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import functools
import grp
import http.server
import ipaddress
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

# --------------------------------------------------------------------------
# constants and configuration
# --------------------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_HOSTS = 4
DEFAULT_PORT = 2222
USER_PREFIX = "hfnode"
SSHD = "/usr/sbin/sshd"
APT_PACKAGES = ["docker.io", "openssh-server", "sudo", "debootstrap"]
# what each package must provide; a package counts as missing if its binary is
PACKAGE_BINARIES = {
    "docker.io": "/usr/sbin/dockerd",
    "openssh-server": SSHD,
    "sudo": "/usr/bin/sudo",
    "debootstrap": "/usr/sbin/debootstrap",
}

BOOTSTRAP_IMAGE = "higgsfield-testbase:bookworm"
BASE_IMAGE = "higgsfield-testbase:torch2.13"
TORCH_VERSION = "2.13.0"
SUITE = "bookworm"
DEBOOTSTRAP_INCLUDE = "python3,python3-venv,python3-pip,git,openssh-client,ca-certificates"
# control-side dependencies of higgsfield (pyproject [project].dependencies)
CONTROL_DEPS = ["click", "pydantic", "pyyaml", "jinja2", "rich", "asyncssh", "docker"]
# numpy: without it every `import torch` warns "Failed to initialize NumPy"
IMAGE_REQUIREMENTS = [f"torch=={TORCH_VERSION}", "numpy", *CONTROL_DEPS]
IMAGE_VENV = "/opt/venv"
DOCKER_SOCKET = "/var/run/docker.sock"

APT_WAIT_S = 30 * 60
DOCKERD_WAIT_S = 90
SSHD_WAIT_S = 20


def state_dir() -> Path:
    return Path(os.environ.get("TESTBED_DIR") or (REPO_ROOT / ".testbed")).resolve()


def host_count(default: int | None = None) -> int:
    if default is not None:
        return default
    return int(os.environ.get("TESTBED_HOSTS", DEFAULT_HOSTS))


def ssh_port() -> int:
    return int(os.environ.get("TESTBED_PORT", DEFAULT_PORT))


def exe(name: str) -> str:
    """Absolute path of a program on PATH (or the bare name, to fail loudly later)."""
    return shutil.which(name) or name


def log(msg: str) -> None:
    print(f"[testbed] {msg}", file=sys.stderr, flush=True)


class TestbedError(RuntimeError):
    pass


# --------------------------------------------------------------------------
# data model
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Host:
    """One test node: a unix user with its own sshd on its own loopback address."""

    index: int
    name: str  # hfnode{i}; also the unix user and the Host alias in ssh_config
    address: str  # 127.0.0.{i+2}
    port: int
    user: str
    home: Path
    dir: Path  # per-host state: sshd_config, host key, pid file, log
    host_key: Path  # private ed25519 host key
    host_pubkey: Path
    sshd_config: Path
    pidfile: Path
    logfile: Path

    @property
    def target(self) -> str:
        return f"{self.user}@{self.address}"

    @property
    def known_hosts_name(self) -> str:
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"


def make_host(i: int, sdir: Path | None = None, port: int | None = None) -> Host:
    sdir = sdir or state_dir()
    port = port or ssh_port()
    if not 0 <= i <= 250:
        raise TestbedError(f"host index out of range: {i}")
    name = f"{USER_PREFIX}{i}"
    address = f"127.0.0.{i + 2}"
    _check_loopback(address)
    hdir = sdir / "hosts" / name
    return Host(
        index=i,
        name=name,
        address=address,
        port=port,
        user=name,
        home=Path("/home") / name,
        dir=hdir,
        host_key=hdir / "ssh_host_ed25519_key",
        host_pubkey=hdir / "ssh_host_ed25519_key.pub",
        sshd_config=hdir / "sshd_config",
        pidfile=hdir / "sshd.pid",
        logfile=hdir / "sshd.log",
    )


def _check_loopback(address: str) -> None:
    if not ipaddress.ip_address(address).is_loopback:
        raise TestbedError(f"refusing non-loopback target {address}")


# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------


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


def require_root() -> None:
    if os.geteuid() != 0:
        raise TestbedError("the test bed needs root (it creates users, sshd daemons, dockerd)")


@contextlib.contextmanager
def state_lock(sdir: Path | None = None) -> Iterator[None]:
    """An exclusive lock on the state dir (re-entrant within one process)."""
    sdir = sdir or state_dir()
    key = str(sdir)
    depth = _LOCK_DEPTH.get(key, 0)
    if depth:
        _LOCK_DEPTH[key] = depth + 1
        try:
            yield
        finally:
            _LOCK_DEPTH[key] -= 1
        return
    sdir.mkdir(parents=True, exist_ok=True)
    fd = os.open(sdir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _LOCK_DEPTH[key] = 1
        try:
            yield
        finally:
            _LOCK_DEPTH[key] = 0
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


_LOCK_DEPTH: dict[str, int] = {}


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


def port_open(address: str, port: int, timeout: float = 1.0) -> bool:
    _check_loopback(address)
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def ssh_banner(address: str, port: int, timeout: float = 2.0) -> bool:
    """True if an SSH server answers on address:port."""
    _check_loopback(address)
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def spawn_daemon(argv: Sequence[object], logfile: Path, env: dict | None = None) -> int:
    """Start argv detached (own session, reparented to init); return its pid."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    script = 'setsid "$@" >>"$TESTBED_LOG" 2>&1 </dev/null & echo $!'
    e = dict(env or os.environ)
    e["TESTBED_LOG"] = str(logfile)
    out = subprocess.run([exe("sh"), "-c", script, "sh", *map(str, argv)], env=e,
                         stdout=subprocess.PIPE, text=True, check=True).stdout
    return int(out.strip())


def write_if_changed(path: Path, text: str, mode: int) -> bool:
    old = None
    with contextlib.suppress(OSError):
        old = path.read_text()
    if old != text:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        return True
    os.chmod(path, mode)
    return False


class Timings:
    """Phase timings; printed at the end and kept in state/timings.json."""

    def __init__(self) -> None:
        self.phases: list[tuple[str, float, str]] = []
        self.t0 = time.monotonic()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[dict]:
        info: dict = {"note": ""}
        t0 = time.monotonic()
        log(f"phase {name} ...")
        try:
            yield info
        finally:
            dt = time.monotonic() - t0
            self.phases.append((name, dt, info["note"]))
            log(f"phase {name}: {dt:.1f}s {info['note']}".rstrip())

    def report(self) -> str:
        lines = [f"  {name:<16} {dt:7.1f}s  {note}".rstrip() for name, dt, note in self.phases]
        lines.append(f"  {'total (wall)':<16} {time.monotonic() - self.t0:7.1f}s")
        return "\n".join(lines)

    def save(self, sdir: Path) -> None:
        data = {"at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "phases": [{"name": n, "seconds": round(dt, 2), "note": note}
                           for n, dt, note in self.phases]}
        with contextlib.suppress(OSError):
            (sdir / "timings.json").write_text(json.dumps(data, indent=2) + "\n")


# --------------------------------------------------------------------------
# apt
# --------------------------------------------------------------------------


def _package_installed(pkg: str) -> bool:
    p = subprocess.run([exe("dpkg-query"), "-W", "-f=${Status}", pkg], capture_output=True, text=True)
    ok = p.returncode == 0 and p.stdout.strip() == "install ok installed"
    binary = PACKAGE_BINARIES.get(pkg)
    return ok and (binary is None or os.access(binary, os.X_OK))


def _apt_busy() -> list[str]:
    busy = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            comm = Path(f"/proc/{entry}/comm").read_text().strip()
        except OSError:
            continue
        if comm in ("apt-get", "apt", "dpkg", "aptitude", "unattended-upgr"):
            busy.append(f"{entry}:{comm}")
    return busy


def wait_for_apt(timeout: float = APT_WAIT_S) -> float:
    """Wait for a running apt-get/dpkg (e.g. a background install) to finish."""
    t0 = time.monotonic()
    announced = False
    while True:
        busy = _apt_busy()
        if not busy:
            return time.monotonic() - t0
        if not announced:
            log(f"waiting for a running package manager to finish: {', '.join(busy)}")
            announced = True
        if time.monotonic() - t0 > timeout:
            raise TestbedError(f"package manager still busy after {timeout:.0f}s: {busy}")
        time.sleep(2)


def ensure_packages(packages: Sequence[str] = APT_PACKAGES) -> str:
    waited = wait_for_apt()
    missing = [p for p in packages if not _package_installed(p)]
    if not missing:
        return "all present" + (f" (waited {waited:.0f}s for apt)" if waited > 1 else "")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lock_opt = ["-o", f"DPkg::Lock::Timeout={APT_WAIT_S}"]
    run(["apt-get", *lock_opt, "update"], env=env)
    run(["apt-get", *lock_opt, "install", "-y", *missing], env=env)
    still = [p for p in missing if not _package_installed(p)]
    if still:
        raise TestbedError(f"apt-get did not install: {still}")
    return "installed " + " ".join(missing)


# --------------------------------------------------------------------------
# users, keys, sshd
# --------------------------------------------------------------------------


def ensure_client_key(sdir: Path) -> Path:
    """The 'laptop' identity of the test user, authorized on every host."""
    cdir = sdir / "client"
    cdir.mkdir(parents=True, exist_ok=True)
    os.chmod(cdir, 0o700)
    key = cdir / "id_ed25519"
    if not (key.exists() and key.with_suffix(".pub").exists()):
        for p in (key, key.with_suffix(".pub")):
            p.unlink(missing_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "higgsfield-testbed-laptop",
             "-f", key])
    os.chmod(key, 0o600)
    return key


def _user_exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


def ensure_user(host: Host, client_pub: str) -> None:
    user = host.user
    if not _user_exists(user):
        run(["useradd", "--create-home", "--home-dir", host.home, "--shell", "/bin/bash",
             "--comment", f"higgsfield test node {host.index}", user])
    pw = pwd.getpwnam(user)
    if Path(pw.pw_dir) != host.home:
        raise TestbedError(f"user {user} exists with home {pw.pw_dir}, expected {host.home}")
    # useradd leaves the account locked ('!'); '*' = no password but key login works
    shadow = subprocess.run([exe("getent"), "shadow", user], capture_output=True, text=True).stdout
    if shadow.split(":")[1:2] != ["*"]:
        run(["usermod", "-p", "*", user])
    if not host.home.is_dir():
        host.home.mkdir(parents=True)
        for item in Path("/etc/skel").iterdir():
            dest = host.home / item.name
            if item.is_dir():
                shutil.copytree(item, dest, dirs_exist_ok=True)
            else:
                shutil.copy2(item, dest)
        run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", host.home], quiet=True)
    os.chown(host.home, pw.pw_uid, pw.pw_gid)
    os.chmod(host.home, 0o750)  # StrictModes: not group/world writable
    ssh_dir = host.home / ".ssh"
    ssh_dir.mkdir(exist_ok=True)
    os.chown(ssh_dir, pw.pw_uid, pw.pw_gid)
    os.chmod(ssh_dir, 0o700)
    ak = ssh_dir / "authorized_keys"
    lines = ak.read_text().splitlines() if ak.exists() else []
    if client_pub not in lines:
        lines.append(client_pub)
        ak.write_text("\n".join(lines) + "\n")
    os.chown(ak, pw.pw_uid, pw.pw_gid)
    os.chmod(ak, 0o600)
    # passwordless sudo
    sudoers = Path("/etc/sudoers.d") / user
    text = f"# higgsfield test bed\n{user} ALL=(ALL:ALL) NOPASSWD: ALL\n"
    if not sudoers.exists() or sudoers.read_text() != text:
        tmp = Path("/etc/sudoers.d") / f".{user}.tmp"  # sudo ignores names with a dot
        tmp.write_text(text)
        os.chmod(tmp, 0o440)
        run(["visudo", "-cqf", tmp], quiet=True)
        os.replace(tmp, sudoers)
    os.chmod(sudoers, 0o440)


def reset_home(host: Host) -> None:
    """Empty a node's home (back to /etc/skel), keeping ~/.ssh/authorized_keys."""
    pw = pwd.getpwnam(host.user)
    home = Path(pw.pw_dir)
    if home != host.home or not home.name.startswith(USER_PREFIX):
        raise TestbedError(f"refusing to reset unexpected home {home}")
    for item in home.iterdir():
        if item.name == ".ssh":
            for sub in item.iterdir():
                if sub.name != "authorized_keys":
                    shutil.rmtree(sub) if sub.is_dir() and not sub.is_symlink() else sub.unlink()
            continue
        if item.is_dir() and not item.is_symlink():
            shutil.rmtree(item)
        else:
            item.unlink()
    for item in Path("/etc/skel").iterdir():
        dest = home / item.name
        if item.is_dir():
            shutil.copytree(item, dest, dirs_exist_ok=True)
        else:
            shutil.copy2(item, dest)
        run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", dest], quiet=True)


def in_docker_group(user: str) -> bool:
    try:
        g = grp.getgrnam("docker")
    except KeyError:
        return False
    return user in g.gr_mem or pwd.getpwnam(user).pw_gid == g.gr_gid


def add_to_docker_group(host: Host) -> None:
    """Give a node user the shared Docker engine (new SSH logins see it)."""
    ensure_docker_group()
    if not in_docker_group(host.user):
        run(["gpasswd", "-a", host.user, "docker"], capture=True)


def remove_from_docker_group(host: Host) -> None:
    if in_docker_group(host.user):
        run(["gpasswd", "-d", host.user, "docker"], capture=True)


def ensure_docker_group() -> None:
    try:
        grp.getgrnam("docker")
    except KeyError:
        run(["groupadd", "--system", "docker"])


def sshd_config_text(host: Host) -> str:
    return f"""\
# higgsfield test bed: node {host.index} ({host.user}); generated, do not edit
ListenAddress {host.address}:{host.port}
HostKey {host.host_key}
PidFile {host.pidfile}
AllowUsers {host.user}
PermitRootLogin no
PubkeyAuthentication yes
AuthorizedKeysFile .ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes yes
UseDNS no
X11Forwarding no
AllowTcpForwarding yes
PrintMotd no
PrintLastLog no
LogLevel VERBOSE
LoginGraceTime 30
MaxStartups 200:30:400
MaxSessions 64
MaxAuthTries 6
ClientAliveInterval 30
ClientAliveCountMax 4
Subsystem sftp internal-sftp
""" + _force_command(host)


# --------------------------------------------------------------------------
# per-command delay: a node "far away" (for bench/setup_fanout.py)
# --------------------------------------------------------------------------

SFTP_SERVER = "/usr/lib/openssh/sftp-server"


def command_delay(host: Host) -> float | None:
    """The delay every SSH session of this host waits before its command, or None (no wrapper)."""
    with contextlib.suppress(OSError, ValueError):
        return float((host.dir / "command_delay").read_text())
    return None


def set_command_delay(host: Host, delay: float | None) -> None:
    """Remember (or forget, with None) the host's per-command delay; the next sshd_config carries it."""
    path = host.dir / "command_delay"
    host.dir.mkdir(parents=True, exist_ok=True)
    if delay is None:
        path.unlink(missing_ok=True)
    else:
        if not 0 <= delay <= 10:
            raise TestbedError(f"command delay out of range: {delay}")
        write_if_changed(path, f"{delay:g}\n", 0o600)


def session_log(host: Host) -> Path:
    """One line per SSH session of a delayed host: ``EPOCHREALTIME COMMAND`` (newlines in it as spaces;
    ``shell`` for a login shell, ``internal-sftp`` for SFTP)."""
    return host.dir.parents[1] / "sessions" / f"{host.name}.log"


def _force_command(host: Host) -> str:
    """``ForceCommand`` for a delayed host: sleep, log the session, then run what the client asked.

    sshd hands a forced command the client's command in SSH_ORIGINAL_COMMAND, and a
    subsystem request too (as its command, ``internal-sftp``), so SFTP goes to the
    external sftp-server after the same delay. The wrapper runs in the user's bash
    and uses builtins only (EPOCHREALTIME, printf), so it adds no process but sleep.
    """
    delay = command_delay(host)
    if delay is None:
        return ""
    log_path = session_log(host)
    sleep = f"sleep {delay:g}; " if delay > 0 else ""
    return (f"ForceCommand {sleep}"
            "c=${SSH_ORIGINAL_COMMAND:-shell}; "
            f"printf '%s %s\\n' \"$EPOCHREALTIME\" \"${{c//$'\\n'/ }}\" >>{log_path}; "
            f"if [ \"$SSH_ORIGINAL_COMMAND\" = internal-sftp ]; then exec {SFTP_SERVER}; fi; "
            f"eval \"${{SSH_ORIGINAL_COMMAND:-exec $SHELL -l}}\"\n")


def _ensure_session_log(host: Host) -> None:
    """The session log exists and the node user (who runs the wrapper) may append to it."""
    path = session_log(host)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o755)
    if not path.exists():
        path.touch(mode=0o644)
    with contextlib.suppress(KeyError):
        pw = pwd.getpwnam(host.user)
        os.chown(path, pw.pw_uid, pw.pw_gid)


def ensure_host_files(host: Host) -> bool:
    """Write the host key and sshd_config if missing or stale; True if the config changed."""
    host.dir.mkdir(parents=True, exist_ok=True)
    os.chmod(host.dir, 0o700)
    if not (host.host_key.exists() and host.host_pubkey.exists()):
        _new_host_key(host)
    os.chmod(host.host_key, 0o600)
    if command_delay(host) is not None:
        _ensure_session_log(host)
    return write_if_changed(host.sshd_config, sshd_config_text(host), 0o600)


def _new_host_key(host: Host) -> None:
    for p in (host.host_key, host.host_pubkey):
        p.unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{host.name}-hostkey",
         "-f", host.host_key])


def _is_our_sshd(pid: int, host: Host) -> bool:
    # the listener rewrites its title to "sshd: /usr/sbin/sshd -f CONFIG ... [listener] ..."
    # (one string); per-connection children ("sshd: USER [priv]") never carry the config
    cmd = " ".join(pid_cmdline(pid))
    return "sshd" in cmd and f"-f {host.sshd_config}" in cmd and pid_alive(pid)


def sshd_pid(host: Host) -> int | None:
    """pid of this host's running sshd listener, or None."""
    pid = read_pid(host.pidfile)
    if pid and _is_our_sshd(pid, host):
        return pid
    # the pid file may be gone (e.g. wiped) while the daemon still runs
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _is_our_sshd(int(entry), host):
            with contextlib.suppress(OSError):
                host.pidfile.write_text(f"{entry}\n")
            return int(entry)
    return None


def host_running(host: Host) -> bool:
    return sshd_pid(host) is not None


def start_host(host: Host) -> int:
    """Start the host's sshd if it is not running; return its pid."""
    with state_lock(host.dir.parents[1]):
        pid = sshd_pid(host)
        if pid:
            return pid
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        os.chmod("/run/sshd", 0o755)
        ensure_host_files(host)
        if port_open(host.address, host.port, timeout=0.5) or _port_bound(host.address, host.port):
            raise TestbedError(f"{host.address}:{host.port} is already taken by another process")
        run([SSHD, "-t", "-f", host.sshd_config], capture=True, quiet=True)
        host.pidfile.unlink(missing_ok=True)
        # sshd daemonizes itself; -E appends its log to a file instead of syslog
        run([SSHD, "-f", host.sshd_config, "-E", host.logfile], quiet=True)
        deadline = time.monotonic() + SSHD_WAIT_S
        while time.monotonic() < deadline:
            pid = read_pid(host.pidfile)
            if pid and pid_alive(pid) and ssh_banner(host.address, host.port):
                return pid
            time.sleep(0.05)
        tail = host.logfile.read_text()[-2000:] if host.logfile.exists() else ""
        raise TestbedError(f"sshd for {host.name} did not come up on "
                           f"{host.address}:{host.port}\n{tail}")


def _port_bound(address: str, port: int) -> bool:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT leftovers
    try:
        s.bind((address, port))
        return False
    except OSError:
        return True
    finally:
        s.close()


def stop_host(host: Host, kill_sessions: bool = False) -> bool:
    """Stop the host's sshd listener (new connections are refused).

    Established sessions survive unless kill_sessions=True (then the sshd
    children serving them are killed too, by pid). Returns True if it was running.
    """
    with state_lock(host.dir.parents[1]):
        pid = sshd_pid(host)
        if not pid:
            return False
        sessions = child_pids(pid) if kill_sessions else []
        kill_and_wait(pid)
        for kid in sessions:
            with contextlib.suppress(TestbedError):
                kill_and_wait(kid, timeout=5)
        deadline = time.monotonic() + 10
        while _port_bound(host.address, host.port) and time.monotonic() < deadline:
            time.sleep(0.05)
        host.pidfile.unlink(missing_ok=True)
        return True


def rekey_host(host: Host) -> str:
    """Restart the host's sshd with a brand-new host key; return the new public key."""
    with state_lock(host.dir.parents[1]):
        stop_host(host)
        _new_host_key(host)
        write_known_hosts_file(host.dir.parents[1])
        start_host(host)
        return host.host_pubkey.read_text().strip()


def set_host_key(host: Host, private_key: bytes, public_key: str) -> None:
    """Install a given host key (e.g. to undo rekey_host) and restart sshd."""
    with state_lock(host.dir.parents[1]):
        stop_host(host)
        host.dir.mkdir(parents=True, exist_ok=True)
        host.host_key.write_bytes(private_key)
        os.chmod(host.host_key, 0o600)
        host.host_pubkey.write_text(public_key.strip() + "\n")
        write_known_hosts_file(host.dir.parents[1])
        start_host(host)


def known_hosts_line(host: Host) -> str:
    keytype, b64 = host.host_pubkey.read_text().split()[:2]
    return f"{host.known_hosts_name} {keytype} {b64}"


def existing_hosts(sdir: Path) -> list[Host]:
    hosts = []
    for d in sorted((sdir / "hosts").glob(f"{USER_PREFIX}*")):
        m = re.fullmatch(rf"{USER_PREFIX}(\d+)", d.name)
        if m:
            hosts.append(make_host(int(m.group(1)), sdir, _configured_port(d)))
    return sorted(hosts, key=lambda h: h.index)


def _configured_port(hdir: Path) -> int | None:
    with contextlib.suppress(OSError):
        m = re.search(r"^ListenAddress \S+:(\d+)$", (hdir / "sshd_config").read_text(), re.M)
        if m:
            return int(m.group(1))
    return None


def write_known_hosts_file(sdir: Path) -> Path:
    path = sdir / "known_hosts"
    lines = [known_hosts_line(h) for h in existing_hosts(sdir) if h.host_pubkey.exists()]
    write_if_changed(path, "".join(line + "\n" for line in lines), 0o644)
    return path


def write_ssh_config(sdir: Path, hosts: Sequence[Host], client_key: Path) -> Path:
    path = sdir / "ssh_config"
    blocks = []
    for h in hosts:
        blocks.append(
            f"Host {h.name}\n"
            f"    HostName {h.address}\n"
            f"    Port {h.port}\n"
            f"    User {h.user}\n"
            f"    IdentityFile {client_key}\n"
            f"    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {sdir / 'known_hosts'}\n"
            f"    StrictHostKeyChecking yes\n"
            f"    BatchMode yes\n"
            f"    ConnectTimeout 10\n"
        )
    write_if_changed(path, "\n".join(blocks), 0o644)
    return path


def ensure_hosts(n: int, sdir: Path, reset_homes: bool = False,
                 reset_docker_group: bool = True, indices: Sequence[int] | None = None,
                 delay: float | None = None) -> list[Host]:
    """Hosts 0..n-1 (or the given ``indices``) exist and run; their sshd restarts if its config changed.

    ``delay``: every SSH session of these hosts waits that many seconds before its
    command (sshd ``ForceCommand``) and is logged in :func:`session_log`; None: no wrapper.
    """
    client_key = ensure_client_key(sdir)
    client_pub = client_key.with_suffix(".pub").read_text().strip()
    hosts = [make_host(i, sdir) for i in (range(n) if indices is None else indices)]
    for h in hosts:
        ensure_user(h, client_pub)
        if reset_homes:
            reset_home(h)
        if reset_docker_group:
            remove_from_docker_group(h)  # provisioning is what adds them
        set_command_delay(h, delay)
        if ensure_host_files(h) and host_running(h):
            stop_host(h)  # a running sshd keeps its old config: restart it with the new one
        start_host(h)
    write_known_hosts_file(sdir)
    write_ssh_config(sdir, existing_hosts(sdir), client_key)
    return hosts


# --------------------------------------------------------------------------
# dockerd
# --------------------------------------------------------------------------


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


# --------------------------------------------------------------------------
# base image
# --------------------------------------------------------------------------


def image_exists(name: str) -> bool:
    return subprocess.run([exe("docker"), "image", "inspect", name], capture_output=True,
                          env=docker_env()).returncode == 0


def debian_mirror() -> str:
    """The Debian mirror apt is configured with (for debootstrap)."""
    if os.environ.get("TESTBED_MIRROR"):
        return os.environ["TESTBED_MIRROR"]
    files = sorted(Path("/etc/apt/sources.list.d").glob("*.sources")) + \
        sorted(Path("/etc/apt/sources.list.d").glob("*.list")) + [Path("/etc/apt/sources.list")]
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line or line[:1].isspace():
                        continue
                    k, v = line.split(":", 1)
                    fields[k.strip().lower()] = v.strip()
                if ("deb" in fields.get("types", "").split()
                        and SUITE in fields.get("suites", "").split()
                        and fields.get("enabled", "yes").lower() != "no"):
                    uri = fields.get("uris", "").split()
                    if uri:
                        return uri[0]
        else:
            for line in text.splitlines():
                parts = re.sub(r"\[[^]]*\]", "", line).split()
                if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE:
                    return parts[1]
    return "http://deb.debian.org/debian"


def build_bootstrap_image(sdir: Path, timings: Timings) -> None:
    rootfs = sdir / "rootfs"
    if rootfs.exists():
        shutil.rmtree(rootfs)  # a partial debootstrap from an interrupted run
    mirror = debian_mirror()
    with timings.phase("debootstrap") as info:
        run(["debootstrap", "--variant=minbase", f"--include={DEBOOTSTRAP_INCLUDE}",
             SUITE, rootfs, mirror])
        # shrink: downloaded .debs and apt lists are not needed in the image
        for p in (rootfs / "var/cache/apt/archives").glob("*.deb"):
            p.unlink()
        shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
        (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
        info["note"] = f"mirror {mirror}"
    with timings.phase("docker import") as info:
        tar = subprocess.Popen([exe("tar"), "--numeric-owner", "-C", rootfs, "-c", "."],
                               stdout=subprocess.PIPE)
        changes = ["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                   "ENV LANG=C.UTF-8", 'CMD ["/bin/bash"]']
        argv = ["docker", "import"]
        for c in changes:
            argv += ["--change", c]
        imp = subprocess.run([*argv, "-", BOOTSTRAP_IMAGE], stdin=tar.stdout,
                             env=docker_env(), capture_output=True, text=True)
        assert tar.stdout is not None
        tar.stdout.close()
        tar_rc = tar.wait()
        if tar_rc != 0 or imp.returncode != 0:
            raise TestbedError(f"docker import failed (tar rc={tar_rc}): {imp.stderr}")
        info["note"] = BOOTSTRAP_IMAGE
    shutil.rmtree(rootfs, ignore_errors=True)


def download_wheels(wheel_dir: Path) -> str:
    """torch (CPU) plus the control-side deps, as wheels for CPython 3.11 manylinux."""
    reqs = list(IMAGE_REQUIREMENTS)
    stamp = wheel_dir / ".complete"
    want = "\n".join(reqs)
    if stamp.exists() and stamp.read_text() == want and list(wheel_dir.glob("torch-*.whl")):
        return "cached"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    # the host's pip config (find-links /opt/wheels) supplies the CPU torch wheel
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", wheel_dir,
            "--only-binary=:all:"]
    if sys.version_info[:2] != (3, 11):
        argv += ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
                 "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
                 "--platform", "linux_x86_64"]
    # captured: the host's pip config makes it warn about every missing local index dir
    run([*argv, *reqs], capture=True)
    if list(wheel_dir.glob("nvidia_*.whl")):
        raise TestbedError(f"pip resolved a CUDA torch build into {wheel_dir}; "
                           f"the test bed needs the CPU wheel of torch {TORCH_VERSION}")
    if not list(wheel_dir.glob(f"torch-{TORCH_VERSION}*.whl")):
        raise TestbedError(f"no torch {TORCH_VERSION} wheel in {wheel_dir}")
    stamp.write_text(want)
    return f"{len(list(wheel_dir.glob('*.whl')))} wheels"


@contextlib.contextmanager
def serve_directory(directory: Path) -> Iterator[str]:
    """Serve a directory over HTTP on 127.0.0.1 (a pip --find-links for docker build)."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


DOCKERFILE = f"""\
FROM {BOOTSTRAP_IMAGE}
# metadata first: every step after the big layer would cost a container commit
ENV VIRTUAL_ENV={IMAGE_VENV} \\
    PATH={IMAGE_VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    LANG=C.UTF-8
LABEL org.higgsfield.testbed="1" org.higgsfield.torch="{TORCH_VERSION}"
CMD ["/bin/bash"]
ARG WHEELS_URL
# wheels come from the host over 127.0.0.1 (no registry, no copy of torch in a layer)
# pip compiles .pyc one file at a time; compileall -j0 uses every core
RUN /usr/bin/python3 -m venv {IMAGE_VENV} \\
 && {IMAGE_VENV}/bin/pip install --no-cache-dir --no-compile --no-index --find-links "$WHEELS_URL" \\
      {' '.join(IMAGE_REQUIREMENTS)} \\
 && ({IMAGE_VENV}/bin/python -m compileall -q -j 0 {IMAGE_VENV}/lib >/dev/null || true) \\
 && {IMAGE_VENV}/bin/python -c "import torch; assert torch.__version__.startswith('{TORCH_VERSION}')"
"""


def image_id(name: str) -> str | None:
    p = subprocess.run([exe("docker"), "image", "inspect", "--format", "{{.Id}}", name],
                       capture_output=True, text=True, env=docker_env())
    return p.stdout.strip() if p.returncode == 0 else None


def build_torch_image(sdir: Path, timings: Timings) -> None:
    wheel_dir = sdir / "wheels"
    old_id = image_id(BASE_IMAGE)
    with timings.phase("pip download") as info:
        info["note"] = download_wheels(wheel_dir)
    with timings.phase("torch layer") as info:
        with tempfile.TemporaryDirectory(prefix="build-", dir=sdir) as ctx:
            (Path(ctx) / "Dockerfile").write_text(DOCKERFILE)
            with serve_directory(wheel_dir) as url:
                env = docker_env()
                env["DOCKER_BUILDKIT"] = "0"  # legacy builder: --network host, no buildx
                run_timestamped(["docker", "build", "--network", "host",
                                 "--build-arg", f"WHEELS_URL={url}", "--tag", BASE_IMAGE, ctx],
                                env=env)
        info["note"] = BASE_IMAGE
    if old_id and old_id != image_id(BASE_IMAGE):
        # the image this rebuild replaced is now untagged; drop it (fails if still in use)
        run(["docker", "image", "rm", old_id], check=False, capture=True, quiet=True)


def ensure_image(sdir: Path, timings: Timings, force: bool = False) -> str:
    """Build the base image unless cached; force rebuilds the torch layer only
    (`docker rmi higgsfield-testbase:bookworm` to redo debootstrap as well)."""
    if not force and image_exists(BASE_IMAGE):
        return f"{BASE_IMAGE} cached"
    if not image_exists(BOOTSTRAP_IMAGE):
        build_bootstrap_image(sdir, timings)
    build_torch_image(sdir, timings)
    return f"built {BASE_IMAGE}"


# --------------------------------------------------------------------------
# top level
# --------------------------------------------------------------------------


def up(hosts: int | None = None, docker: bool = True, image: bool = True,
       reset_homes: bool = False, reset_docker_group: bool = True,
       rebuild_image: bool = False) -> Timings:
    require_root()
    n = host_count(hosts)
    sdir = state_dir()
    timings = Timings()
    with state_lock(sdir):
        with timings.phase("apt") as info:
            info["note"] = ensure_packages()
        with timings.phase("sshd hosts") as info:
            ensure_hosts(n, sdir, reset_homes=reset_homes, reset_docker_group=reset_docker_group)
            info["note"] = f"{n} hosts"
        if docker or image:
            with timings.phase("dockerd") as info:
                info["note"] = ensure_dockerd(sdir)
        if image:
            with timings.phase("image (all)") as info:
                info["note"] = ensure_image(sdir, timings, force=rebuild_image)
        timings.save(sdir)
    return timings


def down(purge: bool = False) -> None:
    require_root()
    sdir = state_dir()
    with state_lock(sdir):
        for h in existing_hosts(sdir):
            if stop_host(h, kill_sessions=True):
                log(f"stopped sshd of {h.name}")
        if stop_dockerd(sdir):
            log("stopped dockerd")
        if purge:
            for h in existing_hosts(sdir):
                if _user_exists(h.user):
                    run(["userdel", "--remove", h.user], check=False, capture=True)
                Path(f"/etc/sudoers.d/{h.user}").unlink(missing_ok=True)
    if purge:
        shutil.rmtree(sdir, ignore_errors=True)


def status() -> dict:
    sdir = state_dir()
    hosts = []
    for h in existing_hosts(sdir):
        pid = sshd_pid(h)
        hosts.append({"name": h.name, "address": f"{h.address}:{h.port}", "pid": pid,
                      "up": bool(pid) and ssh_banner(h.address, h.port),
                      "user": _user_exists(h.user),
                      "docker_group": _user_exists(h.user) and in_docker_group(h.user)})
    answers = docker_answers(timeout=5)
    return {
        "state_dir": str(sdir),
        "hosts": hosts,
        "dockerd": {"answers": answers, "pid_ours": dockerd_pid(sdir)},
        "images": {name: answers and image_exists(name)
                   for name in (BOOTSTRAP_IMAGE, BASE_IMAGE)},
    }


def shell_env() -> str:
    sdir = state_dir()
    hosts = existing_hosts(sdir)
    pairs = {
        "TESTBED_DIR": str(sdir),
        "TESTBED_CLIENT_KEY": str(sdir / "client" / "id_ed25519"),
        "TESTBED_KNOWN_HOSTS": str(sdir / "known_hosts"),
        "TESTBED_SSH_CONFIG": str(sdir / "ssh_config"),
        "TESTBED_HOST_ADDRESSES": " ".join(f"{h.user}@{h.address}:{h.port}" for h in hosts),
        "TESTBED_BASE_IMAGE": BASE_IMAGE,
        "DOCKER_HOST": f"unix://{DOCKER_SOCKET}",
    }
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in pairs.items())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="testbed.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("up", help="install, start and build what is missing (idempotent)")
    p.add_argument("--hosts", type=int, default=None, help=f"default $TESTBED_HOSTS or {DEFAULT_HOSTS}")
    p.add_argument("--no-docker", action="store_true", help="no dockerd (implies --no-image)")
    p.add_argument("--no-image", action="store_true", help="do not build the base image")
    p.add_argument("--rebuild-image", action="store_true", help="rebuild the image even if cached")
    p.add_argument("--reset-homes", action="store_true", help="empty the node users' homes")
    p.add_argument("--keep-docker-group", action="store_true",
                   help="leave node users' docker group membership alone")
    p = sub.add_parser("down", help="stop the sshd daemons and the dockerd this bed started")
    p.add_argument("--purge", action="store_true", help="also delete node users and the state dir")
    sub.add_parser("status", help="print the state as JSON")
    sub.add_parser("env", help="print shell exports describing the bed")
    for name, text in (("start-host", "start host I's sshd if it is not running"),
                       ("stop-host", "stop host I's sshd (fault injection)"),
                       ("rekey-host", "restart host I's sshd with a new host key")):
        p = sub.add_parser(name, help=text)
        p.add_argument("index", type=int)
        if name == "stop-host":
            p.add_argument("--kill-sessions", action="store_true")
    p = sub.add_parser("docker-group", help="add/remove a node user to/from the docker group")
    p.add_argument("action", choices=["add", "remove"])
    p.add_argument("index", type=int)
    args = ap.parse_args(argv)

    try:
        if args.cmd == "up":
            t = up(hosts=args.hosts, docker=not args.no_docker,
                   image=not (args.no_image or args.no_docker), reset_homes=args.reset_homes,
                   reset_docker_group=not args.keep_docker_group,
                   rebuild_image=args.rebuild_image)
            print("test bed up; phase timings:\n" + t.report())
        elif args.cmd == "down":
            down(purge=args.purge)
        elif args.cmd == "status":
            print(json.dumps(status(), indent=2))
        elif args.cmd == "env":
            print(shell_env(), end="")
        elif args.cmd in ("start-host", "stop-host", "rekey-host"):
            require_root()
            host = make_host(args.index, state_dir(), _configured_port(
                state_dir() / "hosts" / f"{USER_PREFIX}{args.index}"))
            if args.cmd == "start-host":
                if not _user_exists(host.user):
                    raise TestbedError(f"{host.user} does not exist; run `up` first")
                print(start_host(host))
            elif args.cmd == "stop-host":
                print("stopped" if stop_host(host, kill_sessions=args.kill_sessions)
                      else "was not running")
            else:
                print(rekey_host(host))
        elif args.cmd == "docker-group":
            require_root()
            host = make_host(args.index)
            (add_to_docker_group if args.action == "add" else remove_from_docker_group)(host)
    except TestbedError as e:
        print(f"testbed: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One sshd per host: its config and host key, and starting, stopping and re-keying it.

Each host's sshd runs from the bed's own config (``sshd -f``), listens on the host's
loopback address only, and is found again by its command line in /proc even when its
pid file is gone. A changed config restarts that host's sshd; an unchanged one does not.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from pathlib import Path

from .base import SSHD, TestbedError, state_lock, write_if_changed
from .delay import command_delay, ensure_session_log, force_command, set_command_delay
from .hosts import Host, existing_hosts, make_host, write_known_hosts_file, write_ssh_config
from .procs import (
    child_pids,
    kill_and_wait,
    pid_alive,
    pid_cmdline,
    port_bound,
    port_open,
    read_pid,
    run,
    ssh_banner,
)
from .users import ensure_client_key, ensure_user, remove_from_docker_group, reset_home

SSHD_WAIT_S = 20


#: Each host's own rendezvous ports (``HIGGSFIELD_RENDEZVOUS_PORTS``, contract/ports.py): 10 from 30000 + 10 x its
#: index, below the ephemeral range (32768) for every index the bed allows (0-250). The bed's "nodes" share this
#: machine's ports, and torchrun's store listens on every address: two runs whose node 0s were two hosts (the two
#: lanes of make test) picked one port of the shared range within the seconds before torchrun binds it, and one
#: run's agents joined the other's store. A host whose 10 are taken falls back to an ephemeral port.
PORTS_BASE, PORTS_PER_HOST = 30000, 10


def rendezvous_ports(index: int) -> tuple[int, int]:
    lo = PORTS_BASE + PORTS_PER_HOST * index
    return lo, lo + PORTS_PER_HOST - 1


def sshd_config_text(host: Host) -> str:
    lo, hi = rendezvous_ports(host.index)
    return f"""\
# higgsfield test bed: node {host.index} ({host.user}); generated, do not edit
ListenAddress {host.address}:{host.port}
SetEnv HIGGSFIELD_RENDEZVOUS_PORTS={lo}-{hi}
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
""" + force_command(host)


def ensure_host_files(host: Host) -> bool:
    """Write the host key and sshd_config if missing or stale; True if the config changed."""
    host.dir.mkdir(parents=True, exist_ok=True)
    os.chmod(host.dir, 0o700)
    if not (host.host_key.exists() and host.host_pubkey.exists()):
        _new_host_key(host)
    os.chmod(host.host_key, 0o600)
    if command_delay(host) is not None:
        ensure_session_log(host)
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
        if port_open(host.address, host.port, timeout=0.5) or port_bound(host.address, host.port):
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
        while port_bound(host.address, host.port) and time.monotonic() < deadline:
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

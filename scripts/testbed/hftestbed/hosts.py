"""The bed's hosts as data: host *i* is unix user ``hfnode{i}`` with an sshd on ``127.0.0.{i+2}``.

Also the files a client needs to reach them: ``known_hosts`` pinned with every host's
real key, and ``ssh_config`` with an alias per host (``ssh -F ssh_config hfnode0``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path

from .base import USER_PREFIX, TestbedError, ssh_port, state_dir, write_if_changed
from .procs import check_loopback


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
    check_loopback(address)
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


def existing_hosts(sdir: Path) -> list[Host]:
    hosts = []
    for d in sorted((sdir / "hosts").glob(f"{USER_PREFIX}*")):
        m = re.fullmatch(rf"{USER_PREFIX}(\d+)", d.name)
        if m:
            hosts.append(make_host(int(m.group(1)), sdir, configured_port(d)))
    return sorted(hosts, key=lambda h: h.index)


def configured_port(hdir: Path) -> int | None:
    with contextlib.suppress(OSError):
        m = re.search(r"^ListenAddress \S+:(\d+)$", (hdir / "sshd_config").read_text(), re.M)
        if m:
            return int(m.group(1))
    return None


def known_hosts_line(host: Host) -> str:
    keytype, b64 = host.host_pubkey.read_text().split()[:2]
    return f"{host.known_hosts_name} {keytype} {b64}"


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

"""The node users: a unix account per host with key-only login, passwordless sudo, and the
"laptop" client key authorized; and their membership of the docker group.

Node users start outside the docker group: provisioning (higgsfield setup) is what adds them.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from .base import USER_PREFIX, TestbedError, exe
from .hosts import Host
from .procs import run


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


def user_exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


def ensure_user(host: Host, client_pub: str) -> None:
    user = host.user
    if not user_exists(user):
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

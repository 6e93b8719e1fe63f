"""The whole bed at once: bring it up, take it down, describe it.

``up`` is idempotent: it installs what is missing, (re)starts sshd daemons and
dockerd that are not running, and skips the image build when the image is already
in the engine. ``down`` stops only what the bed started.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from .apt import ensure_packages
from .base import host_count, log, require_root, state_dir, state_lock
from .dockerd import DOCKER_SOCKET, docker_answers, dockerd_pid, ensure_dockerd, stop_dockerd
from .hosts import existing_hosts
from .image import BASE_IMAGE, BOOTSTRAP_IMAGE, ensure_image, image_exists
from .procs import run, ssh_banner
from .sshd import ensure_hosts, sshd_pid, stop_host
from .timings import Timings
from .users import in_docker_group, user_exists


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
                if user_exists(h.user):
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
                      "user": user_exists(h.user),
                      "docker_group": user_exists(h.user) and in_docker_group(h.user)})
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

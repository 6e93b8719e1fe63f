"""The Debian packages the bed needs: installed with apt-get only when missing.

A package counts as missing when dpkg says so or its binary is gone. A package
manager that is already running (a background install) is waited for, not fought.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from .base import SSHD, TestbedError, exe, log
from .procs import run

# chromium: the dashboard's browser tests (tests/ui) drive Debian's build headless through Playwright;
# acl: a directory two node users share as an NFS export would be (tests/faults' path mirror)
APT_PACKAGES = ["docker.io", "openssh-server", "sudo", "debootstrap", "chromium", "acl"]

# what each package must provide; a package counts as missing if its binary is
PACKAGE_BINARIES = {
    "docker.io": "/usr/sbin/dockerd",
    "openssh-server": SSHD,
    "sudo": "/usr/bin/sudo",
    "debootstrap": "/usr/sbin/debootstrap",
    "chromium": "/usr/lib/chromium/chromium",
    "acl": "/usr/bin/setfacl",
}

APT_WAIT_S = 30 * 60


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

"""Where the bed lives and how it speaks: its state directory, the lock on it, its errors and log.

Every other module of the bed builds on these: the state directory (``$TESTBED_DIR``,
default ``<repo>/.testbed``) holds keys, configs, pids and logs; ``state_lock`` keeps
two ``up`` runs (or a test and a bench) from editing it at once; ``write_if_changed``
is how a file is rewritten only when its text changes, so a re-run restarts nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]

DEFAULT_HOSTS = 4

DEFAULT_PORT = 2222

USER_PREFIX = "hfnode"

SSHD = "/usr/sbin/sshd"


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
    """The bed cannot be made or changed as asked; the CLI prints it as one line and exits 1."""


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

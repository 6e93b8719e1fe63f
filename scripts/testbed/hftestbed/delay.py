"""A host "far away": every SSH session waits a fixed delay before its command (for the benchmarks).

The delay is kept in the host's state directory (``command_delay``), so a later
``start-host`` keeps it, and it becomes an sshd ``ForceCommand`` that sleeps, logs
the session in :func:`session_log` and then runs what the client asked.
"""

from __future__ import annotations

import contextlib
import os
import pwd
from pathlib import Path

from .base import TestbedError, write_if_changed
from .hosts import Host

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


def force_command(host: Host) -> str:
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


def ensure_session_log(host: Host) -> None:
    """The session log exists and the node user (who runs the wrapper) may append to it."""
    path = session_log(host)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o755)
    if not path.exists():
        path.touch(mode=0o644)
    with contextlib.suppress(KeyError):
        pw = pwd.getpwnam(host.user)
        os.chown(path, pw.pw_uid, pw.pw_gid)

"""Host keys pinned in the project's ``known_hosts`` file: trust on first contact, verify ever after.

The file (``ssh.known_hosts`` in higgsfield.yml, default ``.higgsfield/known_hosts``)
is in OpenSSH format, so ``ssh -o UserKnownHostsFile=.higgsfield/known_hosts`` uses it
too, and it is meant to be committed: CI then verifies the same keys.

- A node with no pinned key: the key it offers is pinned (appended to the file) and
  its fingerprint is reported, so the user can compare it with the node's console.
- A node whose key matches: the connection proceeds.
- A node whose key differs: the connection is refused before authentication, with
  :class:`~higgsfield.errors.HostKeyError` naming both fingerprints and the command
  that re-pins deliberately (``higgsfield setup --repin NODE``).

Trust on first use is for ``higgsfield setup`` on a laptop, where the fingerprint is
shown to the user. ``PinnedHosts(..., tofu=False)`` refuses an unpinned node instead
(:class:`~higgsfield.errors.HostNotPinnedError`): CI (``higgsfield ci ...``, whose
pins would be lost with the runner) and ``higgsfield doctor`` use it.

Entries may be plain (``host``, ``[host]:port``, comma-separated) or hashed
(``|1|salt|hash``, as ``ssh-keygen -H`` writes them); ``@cert-authority`` and
``@revoked`` lines and comments are ignored by :meth:`PinnedHosts.lookup` and left
alone by :meth:`PinnedHosts.unpin`.

Checking is never switched off: asyncssh gets the pinned keys as its trusted set
and calls :meth:`HostKeyPolicy.validate_host_public_key` only for keys outside it.

Use::

    pins = PinnedHosts(cfg.known_hosts_path)
    policy = HostKeyPolicy(pins, "gpu-1", "gpu-1.example.com", 22)
    await asyncssh.connect(..., known_hosts=policy.known_hosts(), client_factory=lambda: policy)
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import hashlib
import hmac
import os
from collections.abc import Iterator
from pathlib import Path

import asyncssh

REPIN_HINT = "if the node was reinstalled or rekeyed on purpose, re-pin it with: higgsfield setup --repin {node}"


def entry_name(host: str, port: int) -> str:
    """The OpenSSH known_hosts name of ``host:port`` (``host``, or ``[host]:port`` off port 22)."""
    return host if port == 22 else f"[{host}]:{port}"


def _host_matches(field: str, name: str) -> bool:
    """Whether a known_hosts host field (plain, comma-separated, or hashed ``|1|salt|hash``) names ``name``."""
    if field.startswith("|1|"):
        try:
            salt_b64, hash_b64 = field[3:].split("|", 1)
            salt, digest = base64.b64decode(salt_b64, validate=True), base64.b64decode(hash_b64, validate=True)
        except (ValueError, binascii.Error):
            return False
        return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest)
    return name in field.split(",")


def _entry_for(line: str, name: str) -> list[str] | None:
    """The fields of ``line`` when it is a key entry for ``name`` (not a comment or @marker line)."""
    parts = line.split()
    if len(parts) < 3 or parts[0].startswith(("#", "@")):
        return None
    return parts if _host_matches(parts[0], name) else None


def fingerprint(key: asyncssh.SSHKey) -> str:
    """``SHA256:...`` as ``ssh-keygen -lf`` prints it."""
    return str(key.get_fingerprint("sha256"))


def not_pinned_message(node: str, path: Path) -> str:
    return f"node {node} is not pinned in {_shown(path)}: run 'higgsfield setup' and commit the file"


def _shown(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


class PinnedHosts:
    """The project's known_hosts file. Writes are appended under a file lock."""

    def __init__(self, path: Path, *, writable: bool = True, tofu: bool = True) -> None:
        self.path = Path(path)
        self.writable = writable
        self.tofu = tofu
        """Trust (and, when writable, pin) a node with no pinned key; False refuses it."""

    def _lines(self) -> list[str]:
        try:
            return self.path.read_text().splitlines()
        except FileNotFoundError:
            return []

    def lookup(self, host: str, port: int) -> list[asyncssh.SSHKey]:
        """The keys pinned for exactly ``host:port`` (no wildcard or port-less fallback)."""
        name = entry_name(host, port)
        keys: list[asyncssh.SSHKey] = []
        for line in self._lines():
            parts = _entry_for(line, name)
            if parts is not None:
                with contextlib.suppress(asyncssh.KeyImportError):
                    keys.append(asyncssh.import_public_key(f"{parts[1]} {parts[2]}"))
        return keys

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def pin(self, host: str, port: int, key: asyncssh.SSHKey, comment: str = "") -> None:
        """Append ``key`` for ``host:port`` (a no-op when it is already pinned)."""
        if not self.writable:
            return
        with self._locked():
            if any(k == key for k in self.lookup(host, port)):
                return
            keytype, b64 = key.export_public_key("openssh").decode().split()[:2]
            line = f"{entry_name(host, port)} {keytype} {b64}"
            if comment:
                line += f" {comment}"
            existing = self.path.read_text() if self.path.exists() else ""
            if existing and not existing.endswith("\n"):
                line = "\n" + line
            with open(self.path, "a") as f:
                f.write(line + "\n")

    def unpin(self, host: str, port: int) -> int:
        """Remove every key pinned for ``host:port``; returns how many lines went."""
        name = entry_name(host, port)
        with self._locked():
            lines = self._lines()
            keep = [ln for ln in lines if _entry_for(ln, name) is None]
            if len(keep) != len(lines):
                tmp = self.path.with_name(self.path.name + ".tmp")
                tmp.write_text("".join(f"{ln}\n" for ln in keep))
                os.replace(tmp, self.path)
            return len(lines) - len(keep)


class HostKeyPolicy(asyncssh.SSHClient):
    """The asyncssh client for one connection: pins on first contact, refuses a changed key.

    After the handshake, ``fingerprint`` is the server key's fingerprint and
    ``pinned_now`` says whether it was pinned by this connection; after a refusal,
    ``mismatch`` holds ``(pinned fingerprints, offered fingerprint)``.
    """

    def __init__(self, pins: PinnedHosts, node: str, host: str, port: int) -> None:
        self.pins = pins
        self.node = node
        self.host = host
        self.port = port
        self.pinned = pins.lookup(host, port)
        self.fingerprint: str | None = None
        self.pinned_now = False
        self.mismatch: tuple[list[str], str] | None = None
        self.unpinned = False
        """True after refusing a node with no pinned key (``pins.tofu`` is False)."""

    def known_hosts(self) -> tuple[list[asyncssh.SSHKey], list[asyncssh.SSHKey], list[asyncssh.SSHKey]]:
        """asyncssh's ``known_hosts=``: the pinned keys are the trusted set (may be empty)."""
        return (list(self.pinned), [], [])

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        # asyncssh calls this only for a key outside the trusted (pinned) set.
        offered = fingerprint(key)
        self.fingerprint = offered
        if self.pinned:
            self.mismatch = ([fingerprint(k) for k in self.pinned], offered)
            return False
        if not self.pins.tofu:
            self.unpinned = True
            return False
        self.pins.pin(self.host, self.port, key, comment=f"higgsfield:{self.node}")
        self.pinned_now = self.pins.writable
        return True

    def not_pinned_message(self) -> str:
        return not_pinned_message(self.node, self.pins.path)

    def refusal_message(self) -> str:
        if self.unpinned:
            return self.not_pinned_message()
        pinned, offered = self.mismatch or ([fingerprint(k) for k in self.pinned], "?")
        return (f"host key of {entry_name(self.host, self.port)} changed: it offered {offered}, "
                f"but {self.pins.path} pins {', '.join(pinned)}. Refusing to connect "
                f"(this could be a man-in-the-middle); " + REPIN_HINT.format(node=self.node))

"""Host keys pinned in the project's ``known_hosts`` file: pinned by ``setup`` alone, verified everywhere.

The file (``ssh.known_hosts`` in higgsfield.yml, default ``.higgsfield/known_hosts``)
is in OpenSSH format, so ``ssh -o UserKnownHostsFile=.higgsfield/known_hosts`` uses it
too, and it is meant to be committed: CI then verifies the same keys.

Every connection is strict (:class:`HostKeyPolicy`): asyncssh gets the pinned keys as
its trusted set and any other key is refused during the key exchange, before
authentication, so an impostor never sees a login attempt, a command or a secret:

- no key pinned for the node: :class:`~higgsfield.contract.errors.HostNotPinnedError`;
- a different key pinned: :class:`~higgsfield.contract.errors.HostKeyError` (it could be a
  man in the middle); both messages name the node, ``host:port``, the offered
  fingerprint and the command that fixes it.

Nothing here trusts a key on first use. A pin is written only by ``higgsfield setup``
(:mod:`higgsfield.control.provision.trust`), after it has shown the fingerprint fetched by
:func:`scan_host_key` and the user (or ``--accept-new-host-keys``) accepted it.

Entries may be plain (``host``, ``[host]:port``, comma-separated) or hashed
(``|1|salt|hash``, as ``ssh-keygen -H`` writes them); ``@cert-authority`` and
``@revoked`` lines and comments are ignored by :meth:`PinnedHosts.lookup` and left
alone when :meth:`PinnedHosts.pin` replaces a node's keys.

Use::

    pins = PinnedHosts(cfg.known_hosts_path)
    policy = HostKeyPolicy(pins.lookup(host, port), "gpu-1", host, port, pins.path)
    await asyncssh.connect(..., known_hosts=policy.known_hosts(), client_factory=lambda: policy)
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from higgsfield.contract.errors import HostKeyError, HostNotPinnedError
from higgsfield.control.remote.sshlib import asyncssh

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


def key_type(key: asyncssh.SSHKey) -> str:
    """``ED25519``, ``RSA``, ``ECDSA``... as ``ssh-keygen -lf`` shows it after the fingerprint."""
    alg = key.get_algorithm()
    return {"ssh-ed25519": "ED25519", "ssh-rsa": "RSA", "ssh-dss": "DSA"}.get(
        alg, "ECDSA" if alg.startswith("ecdsa-") else alg)


def shown_path(path: Path) -> str:
    """``path`` relative to the current directory when it is below it (as a user typed it)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def not_pinned_message(node: str, host: str, port: int, offered: str | None, path: Path) -> str:
    offers = f"offers host key {offered}" if offered else "has a host key"
    return (f"{entry_name(host, port)} {offers}, which is not pinned in {shown_path(path)}: refusing to "
            f"connect; run 'higgsfield setup' to check the fingerprint and pin it, then commit the file")


def changed_message(node: str, host: str, port: int, offered: str | None, pinned: Sequence[str],
                    path: Path) -> str:
    return (f"host key of {entry_name(host, port)} changed: it offers {offered or 'a key of another type'}, "
            f"but {shown_path(path)} pins {', '.join(pinned)}. Refusing to connect (this could be a "
            f"man-in-the-middle); " + REPIN_HINT.format(node=node))


class PinnedHosts:
    """The project's known_hosts file. Writes are atomic or appended under a file lock.

    Only ``higgsfield setup`` writes (:mod:`higgsfield.control.provision.trust`); every other
    caller only reads through :meth:`lookup`.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _raw_lines(self) -> list[bytes]:
        try:
            return self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return []

    def _lines(self) -> list[str]:
        # A byte that is not UTF-8 (a hand edit) spoils its own line only, as in OpenSSH.
        return [ln.decode(errors="replace") for ln in self._raw_lines()]

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
        """Hold ``known_hosts.lock`` (a plain ``flock``, as earlier releases took it) while the file changes."""
        from filelock import FileLock

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(self.path.with_name(self.path.name + ".lock"), thread_local=False,
                      preserve_lock_file=True, fallback_to_soft=False):
            yield

    def pin(self, host: str, port: int, key: asyncssh.SSHKey, comment: str = "", *,
            replace: bool = False) -> None:
        """Pin ``key`` for ``host:port``; ``replace`` first drops the keys pinned for it (a re-pin).

        Appending keeps other lines byte for byte; a replace rewrites the file atomically.
        Pinning a key that is already the only one pinned changes nothing.
        """
        keytype, b64 = key.export_public_key("openssh").decode().split()[:2]
        comment = "".join(c if c.isprintable() and not c.isspace() else "_" for c in comment)  # one line, one field
        line = f"{entry_name(host, port)} {keytype} {b64}" + (f" {comment}" if comment else "")
        with self._locked():
            pinned = self.lookup(host, port)
            if any(k == key for k in pinned) and (not replace or len(pinned) == 1):
                return
            if replace and pinned:
                self._unpin_locked(host, port)
            existing = self.path.read_bytes() if self.path.exists() else b""
            if existing and not existing.endswith(b"\n"):
                line = "\n" + line
            with open(self.path, "a") as f:
                f.write(line + "\n")

    def _unpin_locked(self, host: str, port: int) -> int:
        """Remove every key pinned for ``host:port`` (the caller holds the lock); returns how many lines went."""
        name = entry_name(host, port)
        lines = self._raw_lines()
        keep = [ln for ln in lines if _entry_for(ln.decode(errors="replace"), name) is None]  # others byte for byte
        if len(keep) != len(lines):
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_bytes(b"".join(ln + b"\n" for ln in keep))
            os.replace(tmp, self.path)
        return len(lines) - len(keep)


class HostKeyPolicy(asyncssh.SSHClient):
    """The asyncssh client for one connection: the pinned keys are trusted, every other key refused.

    asyncssh calls :meth:`validate_host_public_key` only for a key outside the trusted
    set; it records the offered fingerprint and refuses, so :meth:`refusal` can say
    which key the node offered. After a successful handshake, ``fingerprint`` is set by
    the transport from the connection.
    """

    def __init__(self, pinned: Sequence[asyncssh.SSHKey], node: str, host: str, port: int, path: Path) -> None:
        self.pinned = list(pinned)
        self.node = node
        self.host = host
        self.port = port
        self.path = path
        self.offered: str | None = None
        """The fingerprint of a refused key (None until one is refused)."""

    def known_hosts(self) -> tuple[list[asyncssh.SSHKey], list[asyncssh.SSHKey], list[asyncssh.SSHKey]]:
        """asyncssh's ``known_hosts=``: the pinned keys are the trusted set (may be empty: refuse all)."""
        return (list(self.pinned), [], [])

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.offered = fingerprint(key)
        return False

    def refusal(self, detail: str = "") -> HostKeyError:
        """The error for a refused key: not pinned, or changed."""
        if not self.pinned:
            return HostNotPinnedError(self.node, not_pinned_message(self.node, self.host, self.port, self.offered,
                                                                    self.path))
        message = changed_message(self.node, self.host, self.port, self.offered,
                                  [fingerprint(k) for k in self.pinned], self.path)
        return HostKeyError(self.node, f"{message} ({detail})" if detail else message)


async def scan_host_key(host: str, port: int, timeout: float) -> asyncssh.SSHKey:
    """The host key ``host:port`` offers, fetched by a key exchange alone.

    No authentication is attempted and no channel is opened: the node learns nothing
    about the user, which is what lets ``setup`` show a fingerprint before trusting it.
    Raises OSError / asyncio.TimeoutError / asyncssh.Error like a connection would.
    """
    options = asyncssh.SSHClientConnectionOptions(connect_timeout=timeout)
    key = await asyncio.wait_for(asyncssh.get_server_host_key(host, port, config=None, options=options),
                                 timeout + 1)
    if key is None:  # pragma: no cover - asyncssh returns None only for host-key-less (GSS) kex
        raise asyncssh.KeyExchangeFailed("the server offered no host key")
    return key

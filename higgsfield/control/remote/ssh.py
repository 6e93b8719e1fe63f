"""``SSHTransport``: the Transport for a real node, over asyncssh.

- The connection opens lazily on first use (or at :meth:`connect`), with
  ``ssh.connect_timeout`` for TCP, handshake and authentication together; only
  connection establishment is retried (``ssh.retries`` times, exponential backoff),
  never a command. A failed connection is remembered until :meth:`close`, so the
  commands of one operation don't each pay the timeout and retries again.
- Host keys are checked strictly against the project's known_hosts
  (:mod:`higgsfield.control.remote.hostkeys`) during the key exchange, before authentication:
  an unpinned node raises :class:`~higgsfield.contract.errors.HostNotPinnedError`, a changed
  key :class:`~higgsfield.contract.errors.HostKeyError`, and neither is retried. A transport
  never pins: only ``higgsfield setup`` does, after showing :meth:`scan_host_key`'s
  fingerprint and asking.
- Keys: the node's ``identity_file`` (when set), ssh-agent keys, and ``~/.ssh/id_*``.
  ``~/.ssh/config`` is not read: higgsfield.yml is the one source of truth.
- Commands are argument lists joined with :func:`shlex.join`; each is bounded by
  ``ssh.command_timeout`` (or ``timeout=``); on a timeout or cancellation the remote
  process is signalled and its channel closed. There is no ``env=``: anything on the
  command line is visible in the node's process list, so secrets go through ``input=``
  or :meth:`put_bytes` (SFTP, mode 0600).

Use::

    t = SSHTransport.from_config(cfg, cfg.nodes[1])
    print((await t.run(["uname", "-r"])).stdout, t.fingerprint)
    await t.put_bytes(b"secret", ".higgsfield/token")     # mode 0600, atomic
    await t.close()

One concept, the asyncssh transport: connect with pinned keys and retries, run, stream,
copy. A streamed command's own session lives in :mod:`higgsfield.control.remote.ssh_process`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import secrets
import shlex
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from higgsfield.contract.errors import CommandError, ConnectError, HostKeyError, RemoteError
from higgsfield.control.remote.base import CommandResult, Session, Timeouts, Transport, read_lines
from higgsfield.control.remote.hostkeys import HostKeyPolicy, PinnedHosts, fingerprint, scan_host_key
from higgsfield.control.remote.ssh_process import ProcessSession, stop, text_of
from higgsfield.control.remote.sshlib import asyncssh

if TYPE_CHECKING:
    from higgsfield.control.config import Config, NodeConfig

T = TypeVar("T")

BACKOFF_S = 0.5
BACKOFF_MAX_S = 5.0
_TRANSIENT = (OSError, asyncio.TimeoutError, asyncssh.DisconnectError)   # worth another connect


def build_command(argv: Sequence[str]) -> str:
    """The shell command line for ``argv`` (each argument quoted)."""
    if not argv:
        raise ValueError("empty command")
    return shlex.join(argv)


class SSHTransport(Transport):
    def __init__(self, node: str, host: str, *, user: str, port: int = 22,
                 identity_file: str | None = None, pins: PinnedHosts,
                 trusted: Sequence[asyncssh.SSHKey] = (), timeouts: Timeouts | None = None) -> None:
        self.node = node
        self.host = host
        self.port = port
        self.user = user
        self.identity_file = identity_file
        self.pins = pins
        self.trusted = list(trusted)
        """Keys trusted for this transport alone, besides the pinned ones: those a user
        accepted in a ``setup --dry-run``, which writes no pin."""
        self.timeouts = timeouts or Timeouts()
        self.command_timeout = self.timeouts.command
        self.fingerprint: str | None = None
        """The server host key's SHA256 fingerprint, once connected."""
        self._conn: asyncssh.SSHClientConnection | None = None
        self._failed: BaseException | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def from_config(cls, cfg: Config, node: NodeConfig, *,
                    trusted: Sequence[asyncssh.SSHKey] = ()) -> SSHTransport:
        """The transport for ``node`` with the user, port, key, known_hosts and timeouts of higgsfield.yml."""
        return cls(str(node.name), node.host, user=cfg.node_user(node), port=cfg.node_port(node),
                   identity_file=cfg.node_identity(node), pins=PinnedHosts(cfg.known_hosts_path),
                   trusted=trusted,
                   timeouts=Timeouts(connect=cfg.ssh.connect_timeout, command=cfg.ssh.command_timeout,
                                     retries=cfg.ssh.retries))

    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    # -- connection -------------------------------------------------------------

    async def connect(self) -> None:
        await self._open()

    async def _open(self) -> asyncssh.SSHClientConnection:
        """The open connection, opening it (with retries for connection errors) if needed."""
        async with self._lock:
            if self._failed is not None:
                raise self._failed
            if self._conn is None:
                try:
                    self._conn = await self._with_retries(self._connect_once)
                except (HostKeyError, ConnectError) as e:
                    self._failed = e
                    raise
            return self._conn

    async def scan_host_key(self) -> asyncssh.SSHKey:
        """The host key the node offers, by a key exchange alone (no login), with the connect retries.

        For ``higgsfield setup`` only, which shows its fingerprint before anything is sent.
        """
        async def once() -> asyncssh.SSHKey:
            return await scan_host_key(self.host, self.port, self.timeouts.connect)

        return await self._with_retries(once)

    async def _with_retries(self, attempt_once: Callable[[], Awaitable[T]]) -> T:
        """``attempt_once`` with ``ssh.retries`` more tries on a refused, reset or timed-out connection.

        The back-off doubles from :data:`BACKOFF_S` up to :data:`BACKOFF_MAX_S` (tenacity); a host
        key refusal, an unknown host name or an error already explained is never retried.
        """
        attempts = self.timeouts.retries + 1
        start = time.monotonic()
        retrying = AsyncRetrying(stop=stop_after_attempt(attempts),
                                 wait=wait_exponential(multiplier=BACKOFF_S, max=BACKOFF_MAX_S),
                                 retry=retry_if_exception_type(_TRANSIENT)
                                 & retry_if_not_exception_type((socket.gaierror, RemoteError)),
                                 reraise=True)
        try:
            return await retrying(attempt_once)
        except RemoteError:
            raise
        except socket.gaierror as e:
            raise ConnectError(self.node, f"cannot resolve host '{self.host}': {e.strerror}") from None
        except _TRANSIENT as last:
            spent = time.monotonic() - start
            tries = f"{attempts} attempt{'s' if attempts > 1 else ''} in {spent:.1f}s"
            if isinstance(last, asyncio.TimeoutError):
                raise ConnectError(self.node, f"connect timed out after {self.timeouts.connect:g}s "
                                              f"({self.target}; {tries})") from None
            errno = getattr(last, "errno", None)
            why = (os.strerror(errno) if errno else None) or getattr(last, "reason", None) or str(last)
            raise ConnectError(self.node, f"cannot connect to {self.target}: {why} "
                                          f"({tries}; connect timeout {self.timeouts.connect:g}s)") from None

    async def _connect_once(self) -> asyncssh.SSHClientConnection:
        policy = HostKeyPolicy([*self.pins.lookup(self.host, self.port), *self.trusted],
                               self.node, self.host, self.port, self.pins.path)
        keys: list[str] | tuple[()] = [self.identity_file] if self.identity_file else ()
        if self.identity_file and not Path(self.identity_file).is_file():
            raise ConnectError(self.node, f"identity_file {self.identity_file} does not exist")
        try:
            conn = await asyncio.wait_for(asyncssh.connect(
                self.host, self.port, username=self.user, client_keys=keys,
                known_hosts=policy.known_hosts(), client_factory=lambda: policy,
                config=None, connect_timeout=self.timeouts.connect,
                keepalive_interval=30, keepalive_count_max=4,
            ), self.timeouts.connect + 1)
        except asyncssh.HostKeyNotVerifiable:
            raise policy.refusal() from None
        except (asyncssh.KeyImportError, asyncssh.KeyEncryptionError) as e:
            raise ConnectError(self.node, f"cannot load identity_file {self.identity_file}: {e}; add the key to "
                                          "ssh-agent and omit identity_file, or use an unencrypted key") from None
        except asyncssh.KeyExchangeFailed as e:
            if policy.pinned:  # the node offers no key of the pinned type: a changed key too
                raise policy.refusal(e.reason) from None
            raise
        except asyncssh.PermissionDenied:
            how = f"identity_file {self.identity_file}" if self.identity_file else "ssh-agent and ~/.ssh/id_*"
            raise ConnectError(self.node, f"authentication failed as {self.target} (keys tried: {how}); "
                                          "check ssh.user / identity_file in higgsfield.yml") from None
        key = conn.get_server_host_key()
        self.fingerprint = fingerprint(key) if key else None
        return conn

    async def close(self) -> None:
        conn, self._conn, self._failed = self._conn, None, None
        if conn is not None:
            conn.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.wait_closed(), 5)

    async def reconnect(self) -> None:
        """Close and open a fresh login session (e.g. so a new group membership applies)."""
        await self.close()
        await self._open()

    def _lost(self, argv: Sequence[str], e: BaseException) -> CommandError:
        conn, self._conn = self._conn, None
        if conn is not None:  # dropped, but closed too: no half-open connection (or its tasks) left behind
            with contextlib.suppress(Exception):
                conn.abort()
        return CommandError(self.node, f"connection lost while running '{argv[0]}': {e}")

    # -- commands ---------------------------------------------------------------

    async def run(self, argv: Sequence[str], *, input: str | bytes | None = None,
                  timeout: float | None = None, check: bool = True) -> CommandResult:
        conn = await self._open()
        command = build_command(argv)
        limit = timeout if timeout is not None else self.command_timeout
        data = input.encode() if isinstance(input, str) else input
        try:
            proc = await conn.create_process(command, encoding=None)
        except (asyncssh.DisconnectError, asyncssh.ChannelOpenError, OSError) as e:
            raise self._lost(argv, e) from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(data), limit)
        except asyncio.TimeoutError:
            stop(proc, "KILL")
            raise CommandError(self.node, f"'{argv[0]}' timed out after {limit:g}s") from None
        except asyncio.CancelledError:
            stop(proc, "TERM")
            raise
        except (asyncssh.DisconnectError, OSError) as e:
            raise self._lost(argv, e) from None
        status = proc.exit_status if proc.exit_status is not None else 255
        result = CommandResult(self.node, tuple(argv), status,
                               text_of(out), text_of(err))
        return result.check() if check else result

    async def stream(self, argv: Sequence[str], *, input: str | bytes | None = None) -> AsyncIterator[str]:
        conn = await self._open()
        try:
            # bytes, decoded here: lines are read in chunks, so none is too long (see read_lines)
            proc = await conn.create_process(build_command(argv), encoding=None)
        except (asyncssh.DisconnectError, asyncssh.ChannelOpenError, OSError) as e:
            raise self._lost(argv, e) from None
        try:
            if input is not None:
                proc.stdin.write(input.encode() if isinstance(input, str) else input)
                proc.stdin.write_eof()
            async for line in read_lines(proc.stdout.read):
                yield line
            await proc.wait()
            if proc.exit_status:
                err = text_of(await proc.stderr.read())
                tail = err.strip().splitlines()[-1:] or ["no output"]
                raise CommandError(self.node, f"'{argv[0]}' exited {proc.exit_status}: {tail[0]}",
                                   proc.exit_status, "", err)
        finally:
            if proc.exit_status is None:  # abandoned (break, cancellation): stop the remote command
                stop(proc, "TERM")

    @contextlib.asynccontextmanager
    async def session(self, argv: Sequence[str]) -> AsyncIterator[Session]:
        conn = await self._open()
        try:
            proc = await conn.create_process(build_command(argv), encoding=None)
        except (asyncssh.DisconnectError, asyncssh.ChannelOpenError, OSError) as e:
            raise self._lost(argv, e) from None
        try:
            yield ProcessSession(self.node, tuple(argv), proc)
        except (asyncssh.DisconnectError, OSError) as e:
            raise self._lost(argv, e) from None
        finally:
            if proc.exit_status is None:  # abandoned (an error, cancellation): stop the remote command
                stop(proc, "TERM")

    # -- files ------------------------------------------------------------------

    async def put_bytes(self, data: bytes, path: str, *, mode: int = 0o600) -> None:
        await self._put(path, mode, data=data)

    async def put_file(self, local_path: str, path: str, *, mode: int = 0o644) -> None:
        await self._put(path, mode, local_path=local_path)

    async def _put(self, path: str, mode: int, *, data: bytes | None = None,
                   local_path: str | None = None) -> None:
        """Write to a temporary name created with ``mode`` (never wider), then rename over ``path``."""
        if local_path is not None and not Path(local_path).is_file():
            raise FileNotFoundError(local_path)
        conn = await self._open()
        parent, name = posixpath.split(path)
        tmp = posixpath.join(parent, f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            async with conn.start_sftp_client() as sftp:
                if parent:
                    await sftp.makedirs(parent, exist_ok=True)
                attrs = asyncssh.SFTPAttrs(permissions=mode)
                try:
                    async with sftp.open(tmp, "wb", attrs) as f:
                        if data is not None:
                            await f.write(data)
                        else:
                            assert local_path is not None
                            with open(local_path, "rb") as src:
                                while chunk := src.read(1 << 20):
                                    await f.write(chunk)
                    await sftp.chmod(tmp, mode)
                    await sftp.posix_rename(tmp, path)
                except BaseException:
                    with contextlib.suppress(Exception):
                        await sftp.remove(tmp)
                    raise
        except asyncssh.SFTPError as e:
            raise CommandError(self.node, f"cannot write {path}: {e.reason}") from None
        except (asyncssh.DisconnectError, OSError) as e:
            raise self._lost(["sftp"], e) from None

    async def get_file(self, path: str, local_path: str, *, offset: int = 0, end: int | None = None,
                       progress: Callable[[int], None] | None = None) -> None:
        """SFTP on this transport's connection: no new login, the bytes from ``offset`` on.

        asyncssh's ``read_parallel`` keeps a window of read requests in flight (what its
        own ``get`` does), where one read awaited at a time left the link idle between
        reads: ``bench/pull_throughput.py`` measured that loop at 0.44 of a plain SFTP
        get's throughput. Blocks arrive in any order and are written at their offsets;
        if the copy stops, the file is cut back to the end of its gapless prefix, so a
        resume from its size continues from bytes that are all there.
        """
        conn = await self._open()
        try:
            async with conn.start_sftp_client() as sftp, sftp.open(path, "rb") as f:
                with open(local_path, "r+b" if os.path.exists(local_path) else "wb") as out:
                    out.truncate(offset)
                    prefix = _Prefix(offset)
                    try:
                        async for pos, chunk in await f.read_parallel(-1 if end is None else end - offset, offset):
                            assert isinstance(chunk, bytes)  # opened "rb"
                            out.seek(pos)
                            out.write(chunk)
                            prefix.add(pos, len(chunk))
                            if progress is not None:
                                progress(len(chunk))
                    except BaseException:
                        out.truncate(prefix.end)
                        raise
        except asyncssh.SFTPError as e:
            raise CommandError(self.node, f"cannot read {path}: {e.reason}") from None
        except (asyncssh.DisconnectError, ConnectionError) as e:
            raise self._lost(["sftp"], e) from None


class _Prefix:
    """Where the bytes received without a gap from ``start`` end, as blocks arrive in any order."""

    def __init__(self, start: int) -> None:
        self.end = start
        self._ahead: dict[int, int] = {}   # a block's start -> its end, for blocks past a gap

    def add(self, pos: int, size: int) -> None:
        self._ahead[pos] = pos + size
        while self.end in self._ahead:
            self.end = self._ahead.pop(self.end)

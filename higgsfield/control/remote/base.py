"""The ``Transport`` interface: run a command on one node, stream its output, send a file.

Two implementations: :class:`~higgsfield.control.remote.local.LocalTransport` (a subprocess,
for ``host: localhost``) and :class:`~higgsfield.control.remote.ssh.SSHTransport` (asyncssh).
Commands are argument lists, never shell strings: a transport that needs a shell
(SSH) quotes them with :func:`shlex.join`. Secrets travel on stdin (``input=``) or
as files written with mode 0600 (:meth:`Transport.put_bytes`), never in argv; for
that reason ``run`` takes no ``env=`` (over SSH it could only be ``env K=V`` on the
command line, visible in the node's process list).

Paths on a node are relative to the login user's home directory (``.higgsfield/...``)
or absolute; ``~`` is not expanded inside quoted arguments, so don't use it.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from higgsfield.contract.errors import CommandError
from higgsfield.contract.text import LineSplitter

#: Bytes of one line a transport passes on; the rest is cut with a marker. Above the node side's own
#: cap (:data:`higgsfield.contract.text.MAX_LINE`, what ``invoker logs`` sends), so it only bounds memory.
WIRE_LINE = 1 << 20
#: Bytes asked of a stream per read: a line of any length costs reads, never one unbounded buffer.
READ_CHUNK = 1 << 16


@dataclass(frozen=True)
class CommandResult:
    """What one command did on one node."""

    node: str
    argv: tuple[str, ...]
    exit_status: int
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    def check(self) -> CommandResult:
        """Raise CommandError (with the tail of stderr) unless the command succeeded."""
        if not self.ok:
            tail = (self.stderr.strip() or self.stdout.strip()).splitlines()[-1:] or ["no output"]
            raise CommandError(self.node, f"'{self.argv[0]}' exited {self.exit_status}: {tail[0]}",
                               self.exit_status, self.stdout, self.stderr)
        return self


@dataclass(frozen=True)
class Timeouts:
    """Seconds allowed per phase; ``None`` means no limit."""

    connect: float = 10.0
    command: float | None = 900.0
    retries: int = 2


class Session(abc.ABC):
    """One command running on a node with its stdin open, so lines can go both ways.

    For an exchange whose timing matters once the command runs (doctor's clock: the
    node answers a line with its time, and only that round trip counts, not the login
    before it). Get one from :meth:`Transport.session`.
    """

    @abc.abstractmethod
    async def send(self, text: str) -> None:
        """Write ``text`` to the command's stdin (and flush it)."""

    @abc.abstractmethod
    async def receive(self) -> str | None:
        """The command's next stdout line, without its newline; None at the end of its output."""

    @abc.abstractmethod
    async def finish(self) -> CommandResult:
        """Close stdin and wait for the command; ``stdout`` holds what was not received yet."""


async def read_lines(read: Callable[[int], Awaitable[bytes]], max_line: int = WIRE_LINE) -> AsyncIterator[str]:
    """The lines of a byte stream (``read(n)`` returns ``b""`` at its end), each without its newline.

    Reads in chunks, never ``readline`` with a limit: a line longer than ``max_line`` is cut
    with a marker (:class:`~higgsfield.contract.text.LineSplitter`) and every line after it still
    comes, where a limited ``readline`` raised and lost the rest of the stream.
    """
    lines = LineSplitter(max_line)
    while chunk := await read(READ_CHUNK):
        for line in lines.feed(chunk):
            yield line
    for line in lines.end():
        yield line


class LineReader:
    """One line at a time from a byte stream, read in chunks (a :class:`Session`'s ``receive``)."""

    def __init__(self, read: Callable[[int], Awaitable[bytes]], max_line: int = WIRE_LINE) -> None:
        self._read = read
        self._lines = LineSplitter(max_line)
        self._ready: list[str] = []
        self._eof = False

    async def next(self) -> str | None:
        """The next line; None at the end of the stream."""
        while not self._ready and not self._eof:
            chunk = await self._read(READ_CHUNK)
            if chunk:
                self._ready += self._lines.feed(chunk)
            else:
                self._eof = True
                self._ready += self._lines.end()
        return self._ready.pop(0) if self._ready else None

    def unread(self) -> str:
        """What was read but not taken yet, as text (``finish`` puts it before the rest of stdout)."""
        text = "".join(line + "\n" for line in self._ready)
        self._ready.clear()
        return text + "".join(self._lines.end())


class Transport(abc.ABC):
    """One node. Connections open lazily on first use; :meth:`close` is idempotent."""

    node: str
    fingerprint: str | None = None
    """The node's host key fingerprint (SHA256) once connected; None for a transport without one (local)."""
    command_timeout: float | None = None
    """Seconds one command may run when ``run`` is given no ``timeout`` (``ssh.command_timeout``); None: unbounded."""

    async def connect(self) -> None:
        """Open the connection now rather than at the first command (a no-op without one).

        Raises what the first command would: ConnectError, or HostKeyError /
        HostNotPinnedError for a node whose host key is not the pinned one.
        """
        return None

    @abc.abstractmethod
    async def run(self, argv: Sequence[str], *, input: str | bytes | None = None,
                  timeout: float | None = None, check: bool = True) -> CommandResult:
        """Run ``argv`` to completion. ``check`` raises CommandError on a non-zero exit."""

    @abc.abstractmethod
    def stream(self, argv: Sequence[str], *, input: str | bytes | None = None) -> AsyncIterator[str]:
        """Run ``argv`` and yield its stdout line by line (without the newline) until it exits."""

    def session(self, argv: Sequence[str]) -> AbstractAsyncContextManager[Session]:
        """Start ``argv`` with its stdin open (see :class:`Session`); leaving the block stops it if it still runs."""
        raise NotImplementedError(f"{type(self).__name__} has no interactive sessions")

    @abc.abstractmethod
    async def put_bytes(self, data: bytes, path: str, *, mode: int = 0o600) -> None:
        """Write ``data`` to ``path`` on the node with ``mode``, atomically (temp file + rename)."""

    async def put_file(self, local_path: str, path: str, *, mode: int = 0o644) -> None:
        with open(local_path, "rb") as f:
            await self.put_bytes(f.read(), path, mode=mode)

    async def get_file(self, path: str, local_path: str, *, offset: int = 0, end: int | None = None,
                       progress: Callable[[int], None] | None = None) -> None:
        """Copy bytes ``offset``..``end`` (default: to its end) of ``path`` on the node into ``local_path``.

        ``local_path`` is cut to ``offset`` bytes and the copy appended there, so a download
        that stopped resumes where it stopped; ``progress`` gets each chunk's byte count.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot copy files from its node")

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the connection, if any. Safe to call twice."""

    async def __aenter__(self) -> Transport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

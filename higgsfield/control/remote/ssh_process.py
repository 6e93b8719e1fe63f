"""A remote command's process over asyncssh: the session of a streamed command, and how one is stopped.

Apart from :mod:`higgsfield.control.remote.ssh` (connecting, pinning, retries) because
these are about one running process, whichever transport opened it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from higgsfield.control.remote.base import CommandResult, LineReader, Session
from higgsfield.control.remote.sshlib import asyncssh


class ProcessSession(Session):
    """A streamed remote command (:meth:`SSHTransport.stream`): lines in, lines out, then its result."""

    def __init__(self, node: str, argv: tuple[str, ...], proc: asyncssh.SSHClientProcess[Any]) -> None:
        self._node = node
        self._argv = argv
        self._proc = proc
        self._lines = LineReader(proc.stdout.read)   # bytes in chunks: no line is too long

    async def send(self, text: str) -> None:
        self._proc.stdin.write(text.encode())
        await self._proc.stdin.drain()

    async def receive(self) -> str | None:
        return await self._lines.next()

    async def finish(self) -> CommandResult:
        self._proc.stdin.write_eof()
        out, err = await asyncio.gather(self._proc.stdout.read(), self._proc.stderr.read())
        await self._proc.wait()
        status = self._proc.exit_status if self._proc.exit_status is not None else 255
        return CommandResult(self._node, self._argv, status, self._lines.unread() + text_of(out), text_of(err))


def stop(proc: asyncssh.SSHClientProcess[Any], signal: str) -> None:
    """Stop a remote command that is still running: signal it, then close its channel.

    sshd delivers the signal (OpenSSH >= 7.9) and closing the channel hangs up a
    command that ignores it; neither waits, so this is safe while being cancelled.
    """
    with contextlib.suppress(Exception):
        proc.send_signal(signal)
    with contextlib.suppress(Exception):
        proc.close()


def text_of(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data

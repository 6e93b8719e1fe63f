"""``LocalTransport``: the Transport for ``host: localhost``, a plain subprocess.

It behaves like SSH does: commands start in the user's home directory, relative
paths are relative to it, and the process gets stdin when ``input`` is given.
A command is bounded by ``timeout=`` or else the transport's ``command_timeout``
(``ssh.command_timeout`` through :func:`~higgsfield.control.remote.fanout.transport_for`);
a timed-out or cancelled command is killed, and always reaped (:func:`_end`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from higgsfield.contract.errors import CommandError
from higgsfield.control.remote.base import CommandResult, LineReader, Session, Transport, read_lines


class LocalTransport(Transport):
    def __init__(self, node: str = "localhost", home: str | None = None,
                 command_timeout: float | None = None) -> None:
        self.node = node
        self.home = home or os.path.expanduser("~")
        self.command_timeout = command_timeout
        """Seconds a command may run when ``run`` gets no ``timeout=``; None: no limit."""

    def _path(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else Path(self.home) / p

    async def run(self, argv: Sequence[str], *, input: str | bytes | None = None,
                  timeout: float | None = None, check: bool = True) -> CommandResult:
        data = input.encode() if isinstance(input, str) else input
        limit = timeout if timeout is not None else self.command_timeout
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=self.home,
                stdin=asyncio.subprocess.PIPE if data is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except FileNotFoundError:
            raise CommandError(self.node, f"command not found: {argv[0]}", 127) from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(data), limit)
        except asyncio.TimeoutError:
            await _end(proc)
            raise CommandError(self.node, f"'{argv[0]}' timed out after {limit:g}s", None) from None
        except asyncio.CancelledError:
            await _end(proc)
            raise
        result = CommandResult(self.node, tuple(argv), proc.returncode or 0,
                               out.decode(errors="replace"), err.decode(errors="replace"))
        return result.check() if check else result

    async def stream(self, argv: Sequence[str], *, input: str | bytes | None = None) -> AsyncIterator[str]:
        data = input.encode() if isinstance(input, str) else input
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=self.home,
            stdin=asyncio.subprocess.PIPE if data is not None else asyncio.subprocess.DEVNULL,
            # limit: how much unread stderr is buffered before the command is paused (lines are read in chunks)
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, limit=1 << 20)
        if data is not None and proc.stdin is not None:
            proc.stdin.write(data)
            await proc.stdin.drain()
            proc.stdin.close()
        assert proc.stdout is not None
        try:
            async for line in read_lines(proc.stdout.read):   # chunks: no line is too long
                yield line
            await proc.wait()
        finally:
            if proc.returncode is None:
                await _end(proc, signal.SIGTERM)
        if proc.returncode:
            err = (await proc.stderr.read()).decode(errors="replace") if proc.stderr else ""
            tail = err.strip().splitlines()[-1:] or ["no output"]
            raise CommandError(self.node, f"'{argv[0]}' exited {proc.returncode}: {tail[0]}", proc.returncode,
                               "", err)

    @contextlib.asynccontextmanager
    async def session(self, argv: Sequence[str]) -> AsyncIterator[Session]:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=self.home, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, limit=1 << 20)
        except FileNotFoundError:
            raise CommandError(self.node, f"command not found: {argv[0]}", 127) from None
        try:
            yield _LocalSession(self.node, tuple(argv), proc)
        finally:
            if proc.returncode is None:
                await _end(proc)

    async def put_bytes(self, data: bytes, path: str, *, mode: int = 0o600) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    async def get_file(self, path: str, local_path: str, *, offset: int = 0, end: int | None = None,
                       progress: Callable[[int], None] | None = None) -> None:
        await asyncio.to_thread(_copy_range, self._path(path), Path(local_path), offset, end, progress)

    async def close(self) -> None:
        return None


class _LocalSession(Session):
    def __init__(self, node: str, argv: tuple[str, ...], proc: asyncio.subprocess.Process) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self._node, self._argv, self._proc = node, argv, proc
        self._stdin, self._stdout, self._stderr = proc.stdin, proc.stdout, proc.stderr
        self._lines = LineReader(proc.stdout.read)

    async def send(self, text: str) -> None:
        self._stdin.write(text.encode())
        await self._stdin.drain()

    async def receive(self) -> str | None:
        return await self._lines.next()

    async def finish(self) -> CommandResult:
        self._stdin.close()
        out, err = await asyncio.gather(self._stdout.read(), self._stderr.read())
        code = await self._proc.wait()
        return CommandResult(self._node, self._argv, code, self._lines.unread() + out.decode(errors="replace"),
                             err.decode(errors="replace"))


async def _end(proc: asyncio.subprocess.Process, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to ``proc`` (if it still runs), reap it and close its pipes, even when the task is cancelled
    again meanwhile.

    The dashboard reads in anyio task groups, and a cancelled anyio scope cancels every await inside it, the
    clean-up's too. A child left unreaped, or its pipes left open (a grandchild may hold them), outlives the
    event loop, and when its transport is collected Python prints "Loop ... that handles pid ... is closed"
    and a traceback ("Event loop is closed") on the dashboard's way out. So a cancellation during the wait
    kills the child once (no time is left for a graceful end; a second signal would make Popen poll, and
    reap, the child under the loop's own watcher) and the wait goes on, a few milliseconds after SIGKILL;
    then the transport is closed while the loop runs, and the cancellation is raised.
    """
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    cancelled: asyncio.CancelledError | None = None
    killed = sig == signal.SIGKILL
    while proc.returncode is None:
        try:
            await proc.wait()
        except asyncio.CancelledError as e:
            cancelled = e
            if not killed:
                killed = True
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
    # asyncio.subprocess.Process has no public close; its transport closes itself only once both pipes end
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()
    if cancelled is not None:
        raise cancelled


def _copy_range(src: Path, dst: Path, offset: int, end: int | None,
                progress: Callable[[int], None] | None) -> None:
    """Bytes ``offset``..``end`` of ``src`` appended to ``dst`` cut to ``offset`` (see Transport.get_file)."""
    with open(src, "rb") as f, open(dst, "r+b" if dst.exists() else "wb") as out:
        out.truncate(offset)
        out.seek(offset)
        f.seek(offset)
        left = None if end is None else max(end - offset, 0)
        while left is None or left > 0:
            chunk = f.read(1 << 20 if left is None else min(1 << 20, left))
            if not chunk:
                break
            out.write(chunk)
            left = None if left is None else left - len(chunk)
            if progress is not None:
                progress(len(chunk))

"""An in-process asyncssh server for fast SSH tests (no sshd, no root).

Commands are not executed: the server answers ``echo-argv CMD`` style requests by
writing back the command line it received (to check quoting), reads stdin when asked
(``cat``), sleeps on ``sleep N``, exits with N on ``exit N``, and on ``hang`` waits
until the client closes the channel (recorded in ``closed``). SFTP writes to a
temporary directory. Every connection, login attempt, command and SFTP session is
recorded, so a test can prove that a refused client never got that far.
"""

from __future__ import annotations

import asyncio
import shlex
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncssh


@dataclass
class FakeServer:
    host: str
    port: int
    host_key: asyncssh.SSHKey
    client_key_path: Path
    root: Path
    commands: list[str]
    closed: list[str]
    """Commands whose channel the client closed while they still ran (``hang``)."""
    connections: list[str]
    """One entry per TCP connection that reached the SSH handshake (the peer address)."""
    auths: list[str]
    """One entry per login attempt (the user name), made after the host key was accepted."""
    sftp_sessions: list[str]


async def _handle(process: asyncssh.SSHServerProcess, commands: list[str], closed: list[str]) -> None:
    cmd = process.command or ""
    commands.append(cmd)
    argv = shlex.split(cmd)
    if argv[:1] == ["hang"]:
        await process.channel.wait_closed()
        closed.append(cmd)
    elif argv[:1] == ["cat"]:
        data = await process.stdin.read()
        process.stdout.write(data)
        process.exit(0)
    elif argv[:1] == ["sleep"]:
        await asyncio.sleep(float(argv[1]))
        process.exit(0)
    elif argv[:1] == ["exit"]:
        process.stderr.write(f"failing with {argv[1]}\n")
        process.exit(int(argv[1]))
    else:
        process.stdout.write(cmd + "\n")
        process.exit(0)


@asynccontextmanager
async def fake_server(tmp: Path, host_key: asyncssh.SSHKey | None = None, port: int = 0,
                      client_key: asyncssh.SSHKey | None = None) -> AsyncIterator[FakeServer]:
    """A server on 127.0.0.1 (``port`` 0: a free one) authorizing ``client_key`` (default: a new one)."""
    host_key = host_key or asyncssh.generate_private_key("ssh-ed25519")
    client_key = client_key or asyncssh.generate_private_key("ssh-ed25519")
    key_path = tmp / "client_key"
    key_path.write_bytes(client_key.export_private_key())
    key_path.chmod(0o600)
    root = tmp / "sftp-root"
    root.mkdir(exist_ok=True)
    commands: list[str] = []
    closed: list[str] = []
    connections: list[str] = []
    auths: list[str] = []
    sftp_sessions: list[str] = []
    authorized = asyncssh.import_authorized_keys(client_key.export_public_key().decode())

    class _Server(asyncssh.SSHServer):
        def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
            connections.append(str(conn.get_extra_info("peername")))

        def begin_auth(self, username: str) -> bool:
            auths.append(username)
            return True

    class _SFTP(asyncssh.SFTPServer):
        def __init__(self, chan: asyncssh.SSHServerChannel) -> None:
            sftp_sessions.append(str(chan.get_extra_info("username")))
            super().__init__(chan, chroot=str(root).encode())

    server = await asyncssh.create_server(
        _Server, "127.0.0.1", port, server_host_keys=[host_key],
        authorized_client_keys=authorized, process_factory=lambda p: _handle(p, commands, closed),
        sftp_factory=_SFTP)
    bound = server.sockets[0].getsockname()[1]
    try:
        yield FakeServer("127.0.0.1", bound, host_key, key_path, root, commands, closed, connections, auths,
                         sftp_sessions)
    finally:
        server.close()
        await server.wait_closed()


@asynccontextmanager
async def silent_listener() -> AsyncIterator[int]:
    """A TCP port that accepts connections and never speaks (an SSH server that hangs)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)

"""Serving the dashboard: bind the port, start the hub, run uvicorn on the bound socket, print the URL.

The socket is bound here, before uvicorn starts, so a port that is taken or not a
port is one clear :class:`~higgsfield.contract.errors.UIError` line (exit 2), and ``--port 0``
gets a free port whose number the URL then carries. The hub (its SSH connections)
lives exactly as long as the server.

Use::

    serve(cfg, host="127.0.0.1", port=8765, on_ready=print)   # blocks until Ctrl-C
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass

from higgsfield.contract.errors import UIError
from higgsfield.control.config import Config
from higgsfield.control.ui.hub import Hub
from higgsfield.control.ui.security import Guard, new_token

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


@dataclass(frozen=True)
class Address:
    host: str
    port: int
    token: str

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/?token={self.token}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: a free port); a taken or impossible address is one line."""
    if not 0 <= port <= 65535:
        raise UIError(f"--port {port} is not a TCP port (0-65535; 0 picks a free one)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UIError(f"--host {host}: cannot resolve it ({e.strerror})") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise UIError(f"port {port} on {host} is in use: pick another with --port (or --port 0)") from None
        raise UIError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.setblocking(False)
    return sock


def allowed_hosts(host: str) -> set[str]:
    """The names a browser may use for this server in its Host header."""
    names = {host, "localhost", "127.0.0.1", "[::1]"} if is_loopback(host) else {host}
    if ":" in host and not host.startswith("["):
        names.add(f"[{host}]")
    if not is_loopback(host):
        with contextlib.suppress(OSError):
            names.add(socket.gethostname())
    return names


def serve(cfg: Config, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          on_ready: Callable[[Address], None] = lambda a: None, token: str | None = None,
          sample_every: float | None = None, silent: float | None = None) -> None:
    """Serve the dashboard of ``cfg`` until interrupted; ``on_ready`` gets the address once it listens."""
    try:
        import uvicorn

        from higgsfield.control.ui.app import create_app
    except ImportError as e:
        raise UIError(f"the dashboard needs the 'ui' extra ({e.name} is missing): "
                      "reinstall higgsfield from its repository with the 'ui' extra (README: Install)") from None
    sock = bind(host, port)
    bound_port = int(sock.getsockname()[1])
    address = Address(host, bound_port, token or new_token())

    async def main() -> None:
        hub = Hub(cfg, sample_every=sample_every, silent=silent)
        await hub.start()
        try:
            app = Guard(create_app(hub, address.token), token=address.token, port=bound_port,
                        hosts=allowed_hosts(host))
            config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                    timeout_graceful_shutdown=1, ws="none")
            server = uvicorn.Server(config)
            on_ready(address)
            await server.serve(sockets=[sock])
        finally:
            await hub.close()

    try:
        asyncio.run(main())
    finally:
        sock.close()

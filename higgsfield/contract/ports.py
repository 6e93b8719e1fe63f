"""The rendezvous port range, shared by the node side (``invoker free-port``) and ``higgsfield doctor``.

torchrun's static rendezvous listens on node 0; the port comes from this range so a
firewall rule (and doctor's reachability check) can name it. Only when every port of
the range is taken does the invoker fall back to an ephemeral one.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable

RENDEZVOUS_PORTS = (29500, 29599)   # inclusive: torchrun's default port and the 99 after it


def free_port(reserved: Iterable[int] = (), ports: tuple[int, int] = RENDEZVOUS_PORTS) -> int:
    """A port of ``ports`` that is not ``reserved`` and can be bound now; else an ephemeral one.

    Tried in random order: two runs launched at the same moment (each checks, then
    torchrun binds a little later) rarely get the same port, as they would from the
    first free one.
    """
    taken = set(reserved)
    lo, hi = ports
    for port in random.sample(range(lo, hi + 1), hi - lo + 1):
        if port not in taken and _bindable(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True

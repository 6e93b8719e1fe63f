"""The rendezvous port range, shared by the node side (``invoker free-port``) and ``higgsfield doctor``.

torchrun's static rendezvous listens on node 0; the port comes from this range so a
firewall rule (and doctor's reachability check) can name it. Only when every port of
the range is taken does the invoker fall back to an ephemeral one.

A node whose firewall opens another range names it in the environment of its SSH
sessions: ``HIGGSFIELD_RENDEZVOUS_PORTS=30000-30099`` (sshd's ``SetEnv``). The range is
node 0's: it picks the port, and the other nodes only connect to it.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterable, Mapping

from higgsfield.contract.errors import RunError

RENDEZVOUS_PORTS = (29500, 29599)   # inclusive: torchrun's default port and the 99 after it
PORTS_VAR = "HIGGSFIELD_RENDEZVOUS_PORTS"


def rendezvous_ports(env: Mapping[str, str] = os.environ) -> tuple[int, int]:
    """This node's range: :data:`RENDEZVOUS_PORTS`, or the one ``HIGGSFIELD_RENDEZVOUS_PORTS`` names (``LOW-HIGH``).

    The test bed gives each of its hosts a range of its own: its "nodes" are users of one machine and share
    its ports, where real nodes never do, and two runs whose node 0s are two hosts must not pick one port.
    """
    text = env.get(PORTS_VAR, "").strip()
    if not text:
        return RENDEZVOUS_PORTS
    lo, sep, hi = text.partition("-")
    try:
        a, b = int(lo), int(hi)
    except ValueError:
        a = b = 0
    if not sep or not 1024 <= a <= b <= 65535:
        raise RunError(f"{PORTS_VAR}={text!r} on this node is no port range: give it as LOW-HIGH, "
                       "for example 29500-29599, within 1024-65535")
    return a, b


def free_port(reserved: Iterable[int] = (), ports: tuple[int, int] | None = None) -> int:
    """A port of ``ports`` (this node's range) that is not ``reserved`` and can be bound now; else an ephemeral one.

    Tried in random order: two runs launched at the same moment (each checks, then
    torchrun binds a little later) rarely get the same port, as they would from the
    first free one.
    """
    taken = set(reserved)
    lo, hi = ports or rendezvous_ports()
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

"""The listening socket of a run's coordinator, bound by node 0's ``invoker start`` before any peer starts.

Its own module so that the start (which binds it and hands it to the supervisor) and
the coordinator (which serves on it) share it without the start importing the coordinator.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable

__all__ = ["listen"]


def listen(reserved: Iterable[int] = ()) -> socket.socket:
    """A listening socket for a run's coordinator, on a free port of the rendezvous range.

    The same range as torchrun's rendezvous (:func:`higgsfield.contract.ports.rendezvous_ports`),
    so one firewall rule between the nodes covers both; an ephemeral port when the
    range is full. Bound here and kept: no other run can be handed this port.
    """
    from higgsfield.contract.ports import rendezvous_ports

    lo, hi = rendezvous_ports()
    taken = set(reserved)
    for port in [*random.sample(range(lo, hi + 1), hi - lo + 1), 0]:
        if port in taken:
            continue
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("", port))
            sock.listen(64)
        except OSError:
            sock.close()
            continue
        return sock
    raise OSError("no port to listen on")  # pragma: no cover - port 0 always binds

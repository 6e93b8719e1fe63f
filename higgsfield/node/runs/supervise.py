"""The supervisor process's body (``higgsfield invoker supervise``): the handoff read, the run's Supervisor run.

``higgsfield invoker start`` starts it detached and writes the run's secrets, its gang token
and (node 0) its notify destinations to its stdin; node 0's also gets the coordinator's
listening socket, bound by the start (``--listen-fd``). See :mod:`higgsfield.node.runs.supervisor`.
"""

from __future__ import annotations

import json
import os
import socket
import sys

from higgsfield.contract.codec import decode
from higgsfield.contract.runspec import Handoff
from higgsfield.node.runs.supervisor import Supervisor
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.placement import NodeRun
from higgsfield.node.state.records import RunDir

__all__ = ["supervise"]


def supervise(home: NodeState, project: str, run: str, listen_fd: int | None = None) -> int:
    """Body of the supervisor process (``higgsfield invoker supervise``)."""
    os.umask(0o077)
    handoff = decode(Handoff, json.loads(sys.stdin.read() or "{}"))
    rd = RunDir(home, project, run)
    listener = socket.socket(fileno=listen_fd) if listen_fd is not None else None
    sup = Supervisor(rd, NodeRun.read(rd.spec_path), handoff.secrets, handoff.token, listener, handoff.notify)
    return sup.run()

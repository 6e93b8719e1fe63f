"""``invoker fabric-last``: the newest fabric test's result this node holds, read from the run's own log.

The fabric test's rank 0 prints its result as one line (:data:`~higgsfield.contract.fabric.MARKER`)
into ``rank0.log`` of its run directory on node 0: that line *is* the saved result, so nothing
else is written and it lasts as long as the run directory (``prune`` removes both together).
The newest test whose log holds a readable line wins; one whose line does not decode (cut short,
an older worker) is passed over for the one before.
"""

from __future__ import annotations

import json
from pathlib import Path

from higgsfield.contract.codec import decode
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.fabric import MARKER, FabricResult
from higgsfield.contract.fabric_last import PREFIX, LastFabric
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import list_runs

TAIL_BYTES = 8 << 20
"""Only the end of a log is read: the result line is among the last a test prints."""


def _result_line(log: Path) -> str | None:
    with log.open("rb") as f:
        size = f.seek(0, 2)
        f.seek(max(0, size - TAIL_BYTES))
        data = f.read()
    found = None
    for raw in data.splitlines():
        if raw.startswith(MARKER.encode()):
            found = raw[len(MARKER):].decode("utf-8", "replace")
    return found


def last_fabric(home: NodeState, project: str) -> LastFabric:
    """The newest readable fabric result of ``project`` on this node (an empty reply when none)."""
    logs = []
    for rd in list_runs(home, project):
        log = rd.rank_log(0)
        if rd.run.startswith(PREFIX) and log.is_file() and not log.is_symlink():
            logs.append((log.stat().st_mtime, rd.run, log))
    for at, run, log in sorted(logs, reverse=True):
        line = _result_line(log)
        if line is None:
            continue
        try:
            return LastFabric(run, at, decode(FabricResult, json.loads(line)))
        except (ValueError, DecodeError):
            continue
    return LastFabric()

"""The run states: the words every layer uses for where a run is; nothing spells them again.

A node's record, its ``invoker status`` reply, a :class:`~higgsfield.contract.runstatus.RunStatus`,
``status --json`` and the dashboard all say a run's state with one of :data:`STATES`.

Use::

    if record.state in ACTIVE: ...        # queued, starting, running or stalled: it holds its slots
"""

from __future__ import annotations

QUEUED = "queued"          # waiting for its slots (or for every node to admit it)
STARTING = "starting"    # admitted, torchrun or its container coming up
RUNNING = "running"
STALLED = "stalled"        # running, but no rank progressed within the stall timeout (on_stall=wait)
SUCCEEDED = "succeeded"
FAILED = "failed"
KILLED = "killed"
LOST = "lost"              # a node's part only: the run lost that node and went on without it
SPARE = "spare"            # a node's part only: a spare standing by, holding its slots

STATES = (QUEUED, STARTING, RUNNING, STALLED, SUCCEEDED, FAILED, KILLED)
ACTIVE: frozenset[str] = frozenset({QUEUED, STARTING, RUNNING, STALLED})
TERMINAL: frozenset[str] = frozenset({SUCCEEDED, FAILED, KILLED})

"""When a run has stalled: no rank progressed within the stall timeout (or none started within the startup timeout).

Pure and clocked from outside (every method takes the time), so it is tested without
sleeping and used the same way by the run's coordinator (SSH nodes: every node's
supervisor sends its progress) and by the node-side task of a Slurm job.

Until the first progress of any rank the run is starting: it stalls after
``startup_timeout`` (imports, data loading, compilation are slow and make no steps).
After it, it stalls when the newest progress of *any* node is ``stall_timeout`` old:
a hang stops every rank at a collective, so the newest progress is the right clock,
and one slow node never stalls a run whose other nodes report. 0 turns either off.

Use::

    dog = Watchdog(stall_timeout=600, startup_timeout=1800, started_at=time.time())
    dog.progress("hfnode2", at)            # a node's progress (its own wall time)
    if dog.stalled(time.time()): ...       # dog.since(now): seconds without progress
"""

from __future__ import annotations


class Watchdog:
    """The stall clock of one run."""

    def __init__(self, stall_timeout: float, startup_timeout: float, started_at: float) -> None:
        self.stall_timeout = float(stall_timeout)
        self.startup_timeout = float(startup_timeout)
        self.started_at = float(started_at)
        self.last: dict[str, float] = {}

    @property
    def started(self) -> bool:
        """Some rank has progressed."""
        return bool(self.last)

    def progress(self, who: str, at: float) -> None:
        """``who`` (a node) progressed at ``at``; a time older than one already known, or than the clock's
        (re)start, changes nothing (a report from before a restart)."""
        if at >= self.started_at and at > self.last.get(who, float("-inf")):
            self.last[who] = at

    def latest(self) -> float | None:
        """The newest progress of any node, or None before the first."""
        return max(self.last.values()) if self.last else None

    def since(self, now: float) -> float:
        """Seconds since the newest progress (since the start, before the first)."""
        latest = self.latest()
        return max(0.0, now - (self.started_at if latest is None else max(latest, self.started_at)))

    def stalled(self, now: float) -> bool:
        """No progress within the timeout that applies now (the startup one before the first progress)."""
        limit = self.stall_timeout if self.started else self.startup_timeout
        return limit > 0 and self.since(now) >= limit

    def restart(self, now: float) -> None:
        """Start the clock over (workers restarted, or a stall waited out): the startup timeout applies again
        until the next progress newer than ``now``."""
        self.started_at = now
        self.last = {}

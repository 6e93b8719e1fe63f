"""The pause between two polls of a test's wait, one rule for every wait that polls.

A poll that runs the CLI or an SSH session is not cheap: ``status --json`` on 3 bed nodes is a CLI, an
SSH session and an invoker per node, 1.5 CPU-s machine-wide (5 calls measured). Polled every 0.3 s it
kept both cores, which the two lanes share, busy while the test only waited. So a wait sleeps its
interval, or as long as the poll itself took when that is longer: a costly poll then keeps at most half
of the wait busy, and a cheap one (a file on disk) is as prompt as before.
"""

from __future__ import annotations

import time


def pause_after(started: float, at_least: float) -> None:
    """Sleep before the next poll: ``at_least`` seconds, or the time since ``started`` (the poll's own
    ``time.monotonic()`` at its start) if longer."""
    time.sleep(max(at_least, time.monotonic() - started))

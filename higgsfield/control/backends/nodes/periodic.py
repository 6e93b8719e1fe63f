"""A dashboard watch that asks the up nodes something now and then: the loop, its wake-up and its end.

The drift marks and the fabric marks each ask the fleet's nodes one question at start,
every ``every`` seconds after, and (the fabric marks) at once when :meth:`Periodic.wake`
is called; a round that fails leaves the last answer and the next round asks again.
Subclasses write :meth:`check` only; the fleet runs :meth:`Periodic.run` in its task group.
"""

from __future__ import annotations

import asyncio
import contextlib


class Periodic:
    """Runs :meth:`check` one second after :meth:`run` starts, then every ``every`` seconds or on :meth:`wake`.

    :meth:`run` runs in the fleet's task group until the group is cancelled (the dashboard closing).
    """

    every: float

    def __init__(self, every: float) -> None:
        self.every = every
        self._wake = asyncio.Event()

    async def check(self) -> None:
        raise NotImplementedError

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        await asyncio.sleep(1.0)   # let the feeds connect first
        while True:
            self._wake.clear()
            with contextlib.suppress(Exception):   # a node that fails is left out; the next round asks again
                await self.check()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.every)

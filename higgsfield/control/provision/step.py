"""One provisioning step: ``check`` (read-only), ``apply`` (make it so), ``verify`` (prove it).

A step is idempotent by construction: the runner calls ``apply`` only when ``check``
says the node is not there yet, then ``verify`` must pass. ``check`` never changes
the node, which is what lets ``--dry-run`` run it. It declares what it reads
(``reads``), so the runner asks a node all the checks' commands in one probe.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from higgsfield.contract.errors import StepFailed
from higgsfield.control.provision.context import NodeContext
from higgsfield.control.remote.probe import Read


class Outcome(str, enum.Enum):
    DONE = "done"  # already in place: nothing changed
    APPLIED = "applied"  # changed and verified
    SKIPPED = "skipped"  # does not apply to this node (reason in detail)
    WOULD_APPLY = "would apply"  # dry run: check said it is needed
    FAILED = "failed"
    NOT_RUN = "not run"  # a step it needs failed, or the node was unreachable

    @property
    def ok(self) -> bool:
        return self in (Outcome.DONE, Outcome.APPLIED, Outcome.SKIPPED, Outcome.WOULD_APPLY)


@dataclass(frozen=True)
class Check:
    """What ``check`` found: ``done``; or ``skip`` (not applicable); else needs ``apply``."""

    done: bool
    detail: str = ""
    skip: bool = False


class Step:
    name: ClassVar[str]
    title: ClassVar[str]
    needs: ClassVar[tuple[str, ...]] = ()
    """Steps that must have succeeded on the node first (when they are part of the run)."""

    def reads(self, ctx: NodeContext) -> list[Read]:
        """The read-only commands ``check`` reads (:meth:`NodeContext.read`), asked of the node in one probe.

        A command ``check`` reads that is not declared here still works: it runs on its own session.
        """
        return []

    async def check(self, ctx: NodeContext) -> Check:
        raise NotImplementedError

    async def apply(self, ctx: NodeContext) -> str:
        """Make the change; returns a short description of what was done."""
        raise NotImplementedError

    async def verify(self, ctx: NodeContext) -> str:
        """Raise StepFailed unless the change took effect; returns the detail to show."""
        result = await self.check(ctx)
        if not result.done:
            raise StepFailed(f"{self.name}: still not in place after applying: {result.detail}")
        return result.detail

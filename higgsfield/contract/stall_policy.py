"""A run's stall policy: when a run counts as hung, and what it then does; the defaults written once.

The node side's stall watch (:mod:`higgsfield.node.gang.stall` for SSH nodes,
:mod:`higgsfield.node.slurm_stall` in a Slurm job) acts on it; higgsfield.yml's
``stall_timeout`` / ``startup_timeout`` / ``on_stall`` (:mod:`higgsfield.control.config.schema`),
``higgsfield run``'s flags, the backends and the :class:`~higgsfield.contract.runspec.RunSpec`
fields that carry it to the nodes all take their defaults and choices from here.

Use::

    policy = StallPolicy(stall_timeout=30.0, on_stall=OnStall.WAIT)
    policy.on_stall == "wait"          # True: OnStall is a str, so JSON and YAML read as before
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol


class OnStall(str, enum.Enum):
    """What a run does when no rank progresses within its ``stall_timeout``."""

    FAIL = "fail"
    """Fail it on every node (the GPUs go to the next run)."""
    RESTART = "restart"
    """Restart its workers from the last checkpoint (counted against ``max_restarts``), else fail."""
    WAIT = "wait"
    """Wait: the run shows ``stalled`` until a rank progresses again."""

    def __str__(self) -> str:   # "fail", as the plain string it replaces (f-strings, click, YAML)
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __hash__(self) -> int:  # equal to its string, so hashed like it
        return hash(self.value)


ON_STALL_CHOICES: tuple[str, ...] = tuple(c.value for c in OnStall)
"""The choices as plain strings, in this order: ``("fail", "restart", "wait")``."""


class HasStallFields(Protocol):
    """Anything that carries the three fields (a :class:`~higgsfield.contract.runspec.RunSpec`)."""

    @property
    def stall_timeout(self) -> float: ...
    @property
    def startup_timeout(self) -> float: ...
    @property
    def on_stall(self) -> str: ...


@dataclass(frozen=True)
class StallPolicy:
    """The stall watchdog's settings of one run (timeouts in seconds; 0 turns one off)."""

    stall_timeout: float = 600.0
    """Seconds without progress of any rank (steps reported through ``higgsfield.training.progress``, else
    output lines) after which the run is stalled; 0: never."""
    startup_timeout: float = 1800.0
    """Seconds the run may take to its first progress (imports, data loading, compilation); 0: unbounded."""
    on_stall: OnStall = OnStall.FAIL
    """What a stalled run does (:class:`OnStall`)."""

    @classmethod
    def from_spec(cls, spec: HasStallFields) -> StallPolicy:
        """The policy that ``spec`` (a RunSpec) carries; ValueError for an ``on_stall`` not of :class:`OnStall`."""
        return cls(float(spec.stall_timeout), float(spec.startup_timeout), OnStall(spec.on_stall))

    @property
    def off(self) -> bool:
        """Neither timeout is on: nothing is watched."""
        return self.stall_timeout <= 0 and self.startup_timeout <= 0

    def spec_fields(self) -> dict[str, Any]:
        """These settings as the :class:`~higgsfield.contract.runspec.RunSpec` fields of the same names."""
        return {"stall_timeout": self.stall_timeout, "startup_timeout": self.startup_timeout,
                "on_stall": self.on_stall}


DEFAULT_STALL = StallPolicy()
"""The defaults (higgsfield.yml's, and a RunSpec's when it names none)."""

"""One run across its nodes: :class:`RunStatus`, what ``status``, ``status --json`` and the dashboard show.

A backend makes one per run (the SSH nodes by merging each node's
:class:`~higgsfield.contract.noderuns.NodeRunView`, a Slurm cluster from its job and
record); ``nodes`` holds each node's part (:class:`~higgsfield.contract.nodepart.NodePart`).
``status --json`` prints :func:`status_json`: the codec's encoding of a
:class:`RunStatusJson`, the status with its computed ``duration`` and ``node_states``
(``STATUS_VERSION`` names that schema; the dashboard reads the same object).

Use::

    click.echo(json.dumps({"runs": [status_json(r) for r in runs]}, indent=2))
    decode(RunStatusJson, data)      # reading it back (a test, a script)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from higgsfield.contract.codec import encode, rule
from higgsfield.contract.nodepart import NodePart
from higgsfield.contract.noderuns import AttemptView
from higgsfield.contract.stacks import Diagnosis
from higgsfield.contract.states import ACTIVE
from higgsfield.contract.straggler import Straggler

STATUS_VERSION = 1


@dataclass
class RunStatus:
    """One run across its nodes.

    ``nodes`` maps each node (in node-rank order) to its part of the run (:class:`NodePart`: state,
    slots, exit code, times, stall); a backend without per-node records (a scheduler) fills what it
    knows. ``failed_node`` and ``failed_rank`` name the run's first failure (``failed_rank`` None: the
    node's launcher itself failed), ``error_tail`` the last lines of its error.
    """

    project: str
    experiment: str
    run: str
    state: str
    nodes: dict[str, NodePart]
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    failed_node: str | None = None
    failed_rank: int | None = None
    reason: str | None = None
    error_tail: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    """The run's resolved params (what a re-run starts from); added to schema 1 (readers ignore new keys)."""
    stall: Diagnosis | None = None
    """The diagnosis of the run's latest stall; added to schema 1 like ``params``."""
    stragglers: list[Straggler] = field(default_factory=list)
    """The ranks named slow by their own work per step (:mod:`higgsfield.contract.straggler`); added to schema 1."""
    attempts: list[AttemptView] = field(default_factory=list)
    """Every start of the run's name, oldest first (node 0's record); added to schema 1."""
    lost: list[str] = field(default_factory=list)
    """The nodes it lost and went on without; added to schema 1."""

    @property
    def recoveries(self) -> list[AttemptView]:
        """The attempts a lost node began: when, which nodes were lost, on which nodes it went on."""
        return [a for a in self.attempts if a.lost]

    @property
    def duration(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at or time.time()) - self.started_at

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


def _schema(v: int) -> None:
    if v != STATUS_VERSION:
        raise ValueError(f"is {v} (this higgsfield reads {STATUS_VERSION})")


@dataclass(frozen=True, kw_only=True)
class RunStatusJson:
    """``status --json``'s object for one run: a :class:`RunStatus` with its nodes as names (in node-rank
    order), its ``duration`` and ``node_states`` computed. ``version`` is a field, written first, as the
    schema always was."""

    WHAT: ClassVar[str] = "run status"

    version: int = field(default=STATUS_VERSION, metadata=rule(check=_schema))
    project: str
    experiment: str
    run: str
    state: str
    nodes: list[str]
    created_at: float
    started_at: float | None
    ended_at: float | None
    duration: float | None
    exit_code: int | None
    failed_node: str | None
    failed_rank: int | None
    reason: str | None
    error_tail: list[str]
    params: dict[str, Any]
    stall: Diagnosis | None
    node_states: dict[str, str | None]
    stragglers: list[Straggler] = field(default_factory=list)
    attempts: list[AttemptView] = field(default_factory=list)
    recoveries: list[AttemptView] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, s: RunStatus) -> RunStatusJson:
        return cls(project=s.project, experiment=s.experiment, run=s.run, state=s.state, nodes=list(s.nodes),
                   created_at=s.created_at, started_at=s.started_at, ended_at=s.ended_at, duration=s.duration,
                   exit_code=s.exit_code, failed_node=s.failed_node, failed_rank=s.failed_rank, reason=s.reason,
                   error_tail=list(s.error_tail), params=dict(s.params), stall=s.stall,
                   node_states={n: p.state for n, p in s.nodes.items()}, stragglers=list(s.stragglers),
                   attempts=list(s.attempts), recoveries=s.recoveries, lost=list(s.lost))


def status_json(status: RunStatus) -> dict[str, Any]:
    """``status`` as ``status --json`` prints it (schema ``STATUS_VERSION``)."""
    out: dict[str, Any] = encode(RunStatusJson.of(status))
    return out

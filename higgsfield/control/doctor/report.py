"""What ``higgsfield doctor`` reports: one check's verdict (:class:`Probe`), a node's checks, the whole report.

Its own module because every other part of the doctor builds these and ``doctor --json`` prints
them (:class:`DoctorJson`, encoded): the result types depend on nothing else of the doctor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import higgsfield
from higgsfield.contract.codec import rule
from higgsfield.contract.drift import DriftReport, report_json
from higgsfield.contract.runstatus import RunStatus


class CheckName:
    """The checks' names: each one's column in ``doctor``'s table (in :data:`ALL`'s order) and its key under
    ``checks`` in ``doctor --json`` (besides these, ``drift <what>`` for each fact a node differs in)."""

    SSH: Final = "ssh"
    HOST_KEY: Final = "host key"
    SUDO: Final = "sudo"
    DOCKER: Final = "docker"
    GPUS: Final = "gpus"
    DISK: Final = "disk"
    CLOCK: Final = "clock"
    INVOKER: Final = "invoker"
    ENVIRONMENT: Final = "environment"
    USAGE: Final = "usage"
    RENDEZVOUS: Final = "rendezvous"
    DRIFT: Final = "drift"
    SLURM: Final = "slurm"
    PARTITION: Final = "partition"
    ACCOUNT: Final = "account"
    ALL: Final = (SSH, HOST_KEY, SUDO, DOCKER, GPUS, DISK, CLOCK, INVOKER, ENVIRONMENT, USAGE, RENDEZVOUS, DRIFT,
                  SLURM, PARTITION, ACCOUNT)


@dataclass
class Probe:
    """One check on one node."""

    ok: bool
    summary: str
    problem: str | None = None
    fix: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class NodeDiagnosis:
    node: str
    rank: int
    checks: dict[str, Probe] = field(default_factory=dict)

    @property
    def problems(self) -> list[str]:
        return [f"{self.node}: {name}: {p.problem}" + (f" -> fix: {p.fix}" if p.fix else "")
                for name, p in self.checks.items() if not p.ok and p.problem]


@dataclass
class DoctorReport:
    nodes: list[NodeDiagnosis]
    seconds: float = 0.0
    drift: DriftReport | None = None
    """The nodes compared (:mod:`higgsfield.control.doctor.drift`); None: fewer than two, or a Slurm cluster."""
    runs: list[RunStatus] = field(default_factory=list)
    """The project's runs as the nodes' records say, for the nodes active runs lost (:mod:`.lost`; not in --json)."""

    @property
    def ok(self) -> bool:
        return all(p.ok for n in self.nodes for p in n.checks.values())

    def problems(self) -> list[str]:
        return [p for n in self.nodes for p in n.problems]

    def as_json(self) -> DoctorJson:
        """What ``doctor --json`` prints (``codec.encode`` it)."""
        return DoctorJson(ok=self.ok, seconds=round(self.seconds, 2), version=higgsfield.__version__,
                          nodes=self.nodes, problems=self.problems(),
                          drift=None if self.drift is None else report_json(self.drift))


@dataclass(frozen=True)
class DoctorJson:
    """``doctor --json``: the verdict, each node's checks, the problems in words, the drift when compared."""

    ok: bool
    seconds: float
    version: str
    """This higgsfield's."""
    nodes: list[NodeDiagnosis]
    problems: list[str]
    drift: dict[str, Any] | None = field(default=None, metadata=rule(sparse=True))
    """:func:`~higgsfield.contract.drift.report_json` of the report; left out when the nodes were not compared."""

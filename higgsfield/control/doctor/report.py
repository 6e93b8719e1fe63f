"""What ``higgsfield doctor`` reports: one check's verdict (:class:`Probe`), a node's checks, the whole report.

Its own module because every other part of the doctor builds these and ``doctor --json`` prints
them (:meth:`DoctorReport.to_dict`): the result types depend on nothing else of the doctor.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import higgsfield
from higgsfield.contract.drift import DriftReport


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

    @property
    def ok(self) -> bool:
        return all(p.ok for n in self.nodes for p in n.checks.values())

    def problems(self) -> list[str]:
        return [p for n in self.nodes for p in n.problems]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "seconds": round(self.seconds, 2), "version": higgsfield.__version__,
                "nodes": [{"node": n.node, "rank": n.rank, "checks": {k: asdict(v) for k, v in n.checks.items()}}
                          for n in self.nodes],
                "problems": self.problems(),
                **({"drift": self.drift.to_dict()} if self.drift is not None else {})}

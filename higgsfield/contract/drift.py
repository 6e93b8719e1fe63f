"""Drift: what must be the same on every node of a run, and where it is not.

A run whose nodes differ (the NVIDIA driver, CUDA or NCCL as torch sees them, torch or
another package of the run's environment, Python, the invoker, the image or venv key,
the GPU model or count) hangs at init or writes checkpoints the others cannot load. The
nodes answer ``invoker facts`` with their :class:`NodeFacts` (read from what deploy and
setup left on disk: no subprocess, no import of torch), and :func:`compare` names each
difference against the majority::

    diffs = compare([facts_n1, facts_n2, facts_n3])
    for d in diffs:
        print(d.line())      # "n2: numpy 1.26.4 (the other 2 nodes: 2.1.0)"

A value a node cannot tell (``None``: no GPU driver there) is compared like any other
value for the scalar facts (a driver on two nodes and none on the third is a difference),
while ``packages`` of None means "environment not known" (an image whose packages were
not listed): that node's packages, Python, torch, CUDA and NCCL are left out of the comparison.

The shape of ``doctor --json``'s ``drift`` key (:func:`report_json`; the ``facts`` reply is
:class:`NodeFacts`, encoded by :func:`higgsfield.contract.codec.encode`)::

    {"nodes": [NodeFacts...], "differences": [{"field", "node", "value", "majority", "nodes"}...],
     "unreachable": {"node": "reason"}}
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from higgsfield.contract.codec import encode, rule
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.errors import RunError

SCALARS = ("driver", "cuda", "nccl", "torch", "python", "invoker", "env_key", "gpu_model", "gpu_count")
"""The facts compared one by one, in the order their differences are shown."""
FROM_ENVIRONMENT = frozenset({"cuda", "nccl", "torch", "python"})
"""The scalars read from the run's environment: not known where its ``packages`` are not known either."""
LABELS = {"driver": "NVIDIA driver", "cuda": "CUDA", "nccl": "NCCL", "torch": "torch", "python": "Python",
          "invoker": "higgsfield invoker", "env_key": "environment key", "gpu_model": "GPU model",
          "gpu_count": "GPU count"}
MAX_PACKAGES = 20_000
MAX_TEXT = 8192
FACTS_VERSION = 1
"""The ``facts`` reply's schema (the replies' ``REPLY_VERSION``): none is an older node's, of this shape."""
NONE = "none"
"""How a value the node does not have (no driver, a package not installed) is shown."""


def package_versions(v: object) -> dict[str, str]:
    """``v`` as a package -> version map (both strings, bounded); TypeError or :class:`DecodeError` otherwise."""
    if not isinstance(v, dict):
        raise TypeError("an object of package versions")
    if len(v) > MAX_PACKAGES:
        raise DecodeError(f"too many packages ({len(v)}; at most {MAX_PACKAGES})")
    if not all(isinstance(k, str) and isinstance(x, str) and len(k) < 256 and len(x) < 256 for k, x in v.items()):
        raise TypeError("an object of package names to version strings")
    return dict(v)


def _text(v: str) -> None:
    if len(v) > MAX_TEXT:
        raise ValueError(f"is too long ({len(v)} characters; at most {MAX_TEXT})")


TEXT = rule(check=_text)


@dataclass(frozen=True)
class NodeFacts:
    """``invoker facts``: what one node would run a run of the project with (``None``: cannot tell / has none)."""

    WHAT: ClassVar[str] = "facts reply"
    VERSION: ClassVar[int] = FACTS_VERSION

    node: str = field(default="", metadata=TEXT)
    runtime: str = field(default="", metadata=TEXT)
    """``process`` (the project venv) or ``docker`` (the image), as a run would choose now."""
    driver: str | None = field(default=None, metadata=TEXT)
    cuda: str | None = field(default=None, metadata=TEXT)
    nccl: str | None = field(default=None, metadata=TEXT)
    torch: str | None = field(default=None, metadata=TEXT)
    python: str | None = field(default=None, metadata=TEXT)
    invoker: str | None = field(default=None, metadata=TEXT)
    env_key: str | None = field(default=None, metadata=TEXT)
    gpu_model: str | None = field(default=None, metadata=TEXT)
    gpu_count: int | None = None
    packages: dict[str, str] | None = field(default=None, metadata=rule(decode=package_versions))
    """Package name (canonical) -> version, of the run's environment; None: not known (an image deployed before
    deploy listed images' packages, or one whose Python did not answer)."""

    def value(self, name: str) -> str:
        v = getattr(self, name)
        return NONE if v is None else str(v)


@dataclass(frozen=True)
class Difference:
    """One fact on which ``node`` differs from the majority of the run's nodes."""

    field: str
    """A name of :data:`SCALARS`, or ``package NAME``."""
    node: str
    value: str
    majority: str
    nodes: int = 0
    """How many nodes hold the majority's value."""

    @property
    def label(self) -> str:
        if self.field.startswith("package "):
            return self.field[len("package "):]
        return LABELS.get(self.field, self.field)

    def against(self) -> str:
        """``1.26.4 (the other 2 nodes: 2.1.0)``: this node's value against the majority's."""
        others = f"the other {self.nodes} node{'s' if self.nodes != 1 else ''}" if self.nodes else "the others"
        return f"{self.value} ({others}: {self.majority})"

    def line(self) -> str:
        """``n2: numpy 1.26.4 (the other 2 nodes: 2.1.0)``."""
        return f"{self.node}: {self.label} {self.against()}"


class NodesDrift(RunError):
    """``run`` refused: the nodes differ (exit 2); ``--allow-drift`` runs anyway, ``--exclude`` leaves nodes out."""

    exit_code = 2

    def __init__(self, differences: Sequence[Difference], shown: int = 4) -> None:
        lines = [d.line() for d in differences[:shown]]
        more = f"; and {len(differences) - shown} more" if len(differences) > shown else ""
        super().__init__(f"the nodes differ ({'; '.join(lines)}{more}): fix them, leave the odd ones out "
                         "with --exclude, or run anyway with --allow-drift ('higgsfield doctor' lists all)")
        self.differences = list(differences)


def _majority(values: Sequence[tuple[str, str]]) -> tuple[str, int]:
    """(the most common value, how many hold it); a tie goes to the value of the first node (node 0's)."""
    counts = Counter(v for _, v in values)
    top = max(counts.values())
    for _, v in values:
        if counts[v] == top:
            return v, top
    raise AssertionError("no values")


def _differ(name: str, values: Sequence[tuple[str, str]]) -> list[Difference]:
    if len({v for _, v in values}) <= 1:
        return []
    majority, held = _majority(values)
    return [Difference(name, node, v, majority, held) for node, v in values if v != majority]


def compare(facts: Sequence[NodeFacts]) -> list[Difference]:
    """Every difference among ``facts`` (in node-rank order): scalars first, then packages by name.

    A package one node has and another lacks is a difference (its value there is ``none``);
    a node whose ``packages`` is None (an environment not known: an image not listed) is left out
    of the package comparison and of :data:`FROM_ENVIRONMENT`'s, so one node whose listing failed
    is not "drifted" against the others' Python.
    """
    out: list[Difference] = []
    listed = [f for f in facts if f.packages is not None]
    for name in SCALARS:
        out += _differ(name, [(f.node, f.value(name)) for f in (listed if name in FROM_ENVIRONMENT else facts)])
    names = sorted({p for f in listed for p in (f.packages or {})})
    for p in names:
        out += _differ(f"package {p}", [(f.node, (f.packages or {}).get(p, NONE)) for f in listed])
    return out


def drifted(differences: Sequence[Difference]) -> dict[str, str]:
    """Node -> the reason it is drifted (its differences, one line), for the node picker and the dashboard."""
    out: dict[str, list[str]] = {}
    for d in differences:
        out.setdefault(d.node, []).append(f"{d.label} {d.value} (others: {d.majority})")
    return {node: "drifted: " + ", ".join(items[:3]) + (f" and {len(items) - 3} more" if len(items) > 3 else "")
            for node, items in out.items()}


@dataclass(frozen=True)
class DriftReport:
    """The drift of a set of nodes: their facts, the differences, and the nodes that did not answer."""

    nodes: list[NodeFacts] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, facts: Sequence[NodeFacts], unreachable: Mapping[str, str] | None = None) -> DriftReport:
        return cls(list(facts), compare(facts), dict(unreachable or {}))



def report_json(report: DriftReport) -> dict[str, Any]:
    """``doctor --json``'s ``drift`` (and a Slurm job's ``drift.json``): the report encoded, each node's facts
    without the ``facts`` reply's ``version`` (the shape it always had)."""
    out: dict[str, Any] = encode(report)
    for facts in out["nodes"]:
        facts.pop("version", None)
    return out

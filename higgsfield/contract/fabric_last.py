"""The last fabric test a node holds, and what the dashboard's Nodes view marks of it.

``doctor --fabric`` (and ``run --preflight``) is a run named ``fabric-<time>-<hex>``; its rank 0
prints the result line (:data:`~higgsfield.contract.fabric.MARKER`) into its log on node 0. So
the last result survives the laptop without a copy anywhere: ``higgsfield invoker fabric-last``
reads the newest such line of the project on its node and answers a :class:`LastFabric` (null
``result`` when the node was node 0 of none). The dashboard asks every node and keeps the newest
(:func:`newest`); :func:`node_marks` turns it into each node's figures and its "slow" mark, the
outliers named again by the shared rule (:func:`~higgsfield.contract.fabric.outliers`: never taken
from the node), so the page and ``doctor --fabric`` always agree on which node is slow.

Use::

    last = decode(LastFabric, json.loads(reply))           # DecodeError on a bad one
    marks = node_marks(newest([last_a, last_b]))            # {"n3": {"slow": "...", "busbw_gbps": ...}}
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from higgsfield.contract.codec import decode, rule
from higgsfield.contract.fabric import FabricResult, best_links, outliers

VERSION = 1
PREFIX = "fabric-"
"""The fabric test's run names (:func:`higgsfield.control.doctor.fabric.fabric_plan`)."""


def _fabric_run(v: str) -> None:
    if not v.startswith(PREFIX) or len(v) > 200:
        raise ValueError(f"{v[:200]!r} is not a fabric test's name")


def _time(v: float) -> None:
    if v < 0:
        raise ValueError(f"{v!r} is not a time")


def _named(v: object) -> FabricResult:
    """A node's result (its own version checked), the outliers named again by the shared rule."""
    r = decode(FabricResult, v)
    return replace(r, outliers=outliers(r.pairs))


@dataclass(frozen=True)
class LastFabric:
    """``invoker fabric-last``: the newest fabric result of the project on this node (node 0 of that test)."""

    WHAT: ClassVar[str] = "fabric-last reply"
    VERSION: ClassVar[int] = VERSION

    run: str | None = field(default=None, metadata=rule(check=_fabric_run))
    at: float | None = field(default=None, metadata=rule(check=_time))
    """When its result was written (unix time, the node's clock)."""
    result: FabricResult | None = field(default=None, metadata=rule(decode=_named))
    """The test's figures as the node's worker wrote them, the outliers named here (never taken from the node)."""


def newest(lasts: Iterable[LastFabric | None]) -> LastFabric | None:
    """The most recent result among the nodes' answers (each node holds only the tests it was node 0 of)."""
    have = [x for x in lasts if x is not None and x.result is not None and x.at is not None]
    return max(have, key=lambda x: x.at or 0.0, default=None)


def node_marks(last: LastFabric | None) -> dict[str, dict[str, Any]]:
    """Each measured node's figures for its card, and ``slow`` (one line) when it was the outlier.

    ``busbw_gbps`` is the node's own figure: its ranks among themselves when it has several,
    else its best link; ``link_gbps`` its best link; ``gpu`` "ok", "n/a" or what is wrong.
    """
    if last is None or last.result is None:
        return {}
    r = last.result
    best = best_links(r.pairs)
    slow = {o.node: o.line() for o in r.outliers}
    out: dict[str, dict[str, Any]] = {}
    for n in r.per_node:
        bad = [f"gpu{g.index}: {g.health}" for g in n.gpus or [] if not g.healthy]
        gpu = "n/a" if n.gpus is None else "; ".join(bad) if bad else "ok"
        link = n.link_busbw_gbps if n.link_busbw_gbps is not None else best.get(n.node)
        out[n.node] = {"run": last.run, "at": last.at, "backend": r.backend, "nodes": len(r.nodes),
                       "busbw_gbps": n.intra_busbw_gbps if n.intra_busbw_gbps is not None else link,
                       "link_gbps": link, "write_mbps": n.ckpt_write_mbps, "gpu": gpu,
                       "gpu_ok": not bad, "slow": slow.get(n.node)}
    return out

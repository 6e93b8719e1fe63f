"""The last fabric test a node holds, and what the dashboard's Nodes view marks of it.

``doctor --fabric`` (and ``run --preflight``) is a run named ``fabric-<time>-<hex>``; its rank 0
prints the result line (:data:`~higgsfield.contract.fabric.MARKER`) into its log on node 0. So
the last result survives the laptop without a copy anywhere: ``higgsfield invoker fabric-last``
reads the newest such line of the project on its node and answers a :class:`LastFabric` (null
``result`` when the node was node 0 of none). The dashboard asks every node and keeps the newest
(:func:`newest`); :func:`node_marks` turns it into each node's figures and its "slow" mark, the
outliers named again by the shared rule (:func:`~higgsfield.contract.fabric.outliers`), so the
page and ``doctor --fabric`` always agree on which node is slow.

Use::

    last = LastFabric.from_dict(json.loads(reply))         # DecodeError on a bad one
    marks = node_marks(newest([last_a, last_b]))            # {"n3": {"slow": "...", "busbw_gbps": ...}}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from higgsfield.contract.decode import DecodeError
from higgsfield.contract.fabric import FabricResult, best_links, outliers

VERSION = 1
PREFIX = "fabric-"
"""The fabric test's run names (:func:`higgsfield.control.doctor.fabric.fabric_plan`)."""


@dataclass(frozen=True)
class LastFabric:
    """``invoker fabric-last``: the newest fabric result of the project on this node (node 0 of that test)."""

    run: str | None = None
    at: float | None = None                 # when its result was written (unix time, the node's clock)
    result: FabricResult | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "run": self.run, "at": self.at,
                "result": None if self.result is None else self.result.to_dict()}

    @classmethod
    def from_dict(cls, d: object) -> LastFabric:
        """Decode a node's reply (untrusted); the outliers are named here again, never taken from the node."""
        if not isinstance(d, Mapping):
            raise DecodeError("the fabric-last reply is not an object")
        if d.get("version", VERSION) != VERSION:
            raise DecodeError(f"the fabric-last reply is of version {d.get('version')!r} (this higgsfield reads "
                              f"{VERSION}): upgrade higgsfield here or on the node")
        run, at, raw = d.get("run"), d.get("at"), d.get("result")
        if run is not None and (not isinstance(run, str) or not run.startswith(PREFIX) or len(run) > 200):
            raise DecodeError(f"fabric-last: 'run' {run!r} is not a fabric test's name")
        if at is not None and (isinstance(at, bool) or not isinstance(at, (int, float)) or at < 0):
            raise DecodeError(f"fabric-last: 'at' {at!r} is not a time")
        if raw is None:
            return cls(run, None if at is None else float(at), None)
        r = FabricResult.from_dict(raw)
        r = FabricResult(backend=r.backend, nodes=r.nodes, world_size=r.world_size, allreduce=r.allreduce,
                         pairs=r.pairs, per_node=r.per_node, seconds=r.seconds, run=run or "",
                         outliers=outliers(r.pairs))
        return cls(run, None if at is None else float(at), r)


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

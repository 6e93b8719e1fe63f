"""Where a checkpoint's ranks are: one shared directory or one per node, and which rank is on which node.

Used by :class:`higgsfield.checkpoint.Checkpoint`, which finds its :class:`Layout`
once (a collective) at its first save or load, and checks with :func:`misfit` that
a node-local part is loaded only by the ranks that wrote it. Its own module because
the topology (the probe, the node index of each rank, a node's lead) is one concept
that the save, the load, keep-last-k and the mirror all ask about.

Shared exactly when every rank sees the probe file rank 0 wrote into the
directory (one node, or a filesystem the nodes share); node-local otherwise,
each node's lowest rank (its *lead*) writing its node's marker and trainer state.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from higgsfield.contract.layout import NODE_VAR

__all__ = ["MARKER", "PREFIX", "TMP", "Layout", "agreed_steps", "check_topology", "find_layout", "misfit", "missing",
           "step_of", "write_marker"]

MARKER = "COMPLETE"
PREFIX = "step_"
TMP = ".tmp-"
_PROBE = ".probe-"


@dataclass(frozen=True)
class Layout:
    """Where the ranks are: found once per checkpoint by :func:`find_layout`."""

    shared: bool
    node_of: tuple[int, ...]  # global rank -> node index (nodes numbered by their lowest rank)
    names: tuple[str, ...]    # node index -> its name (HIGGSFIELD_NODE, else the host name)
    dirs: tuple[str, ...]     # node index -> the checkpoint directory there

    def ranks(self, node: int) -> list[int]:
        return [r for r, n in enumerate(self.node_of) if n == node]

    def lead(self, rank: int) -> bool:
        """Does ``rank`` write its node's files (the marker, trainer.pt)? Rank 0 alone on a shared disk."""
        if self.shared:
            return rank == 0
        return rank == min(self.ranks(self.node_of[rank]))


def find_layout(directory: Path) -> Layout:
    """Shared or node-local, and which rank is on which node. Collective.

    A node is a torchrun agent (``GROUP_RANK``), else a host.
    """
    rank = dist.get_rank()
    token = [secrets.token_hex(8) if rank == 0 else None]
    probe = None
    if rank == 0:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            probe = directory / f"{_PROBE}{token[0]}"
            probe.write_text("")
        except OSError:
            probe = None  # nobody sees it: node-local, and the save reports the directory's error
    dist.broadcast_object_list(token, src=0)
    seen = (directory / f"{_PROBE}{token[0]}").is_file()
    node_key = os.environ.get("GROUP_RANK") or socket.gethostname()
    name = os.environ.get(NODE_VAR) or socket.gethostname()
    mine = (seen, node_key, name, str(directory))
    infos: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(infos, mine)  # every rank has looked before anyone removes the probe
    if probe is not None:
        probe.unlink(missing_ok=True)
    order: dict[str, int] = {}
    for _, key, _, _ in infos:
        order.setdefault(key, len(order))
    node_of = tuple(order[key] for _, key, _, _ in infos)
    first = [node_of.index(n) for n in range(len(order))]
    return Layout(shared=all(i[0] for i in infos), node_of=node_of, names=tuple(infos[r][2] for r in first),
                  dirs=tuple(infos[r][3] for r in first))


def step_of(path: Path) -> int:
    """The step a ``step_*`` directory resumes at."""
    return int(path.name[len(PREFIX):])


def check_topology(path: Path, layout: Layout) -> None:
    """A node-local part loads only on the ranks that wrote it (the other nodes' files are elsewhere)."""
    why = misfit(path, layout)
    if why is not None:
        raise ValueError(why)


def misfit(path: Path, layout: Layout) -> str | None:
    """Why the step at ``path`` cannot load on this rank's node as it is (a node-local part written by other
    ranks), or None when it can; called by the node's lead for its load_latest, by every rank for its load."""
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):  # an older or damaged marker: the checkpoint is judged by its files, as before
        marker = {}
    if not isinstance(marker, dict) or marker.get("mode") != "node-local":
        return None
    node = layout.node_of[dist.get_rank()]
    now = {"world_size": dist.get_world_size(), "nodes": len(layout.names), "ranks": layout.ranks(node)}
    then = {k: marker.get(k) for k in now}
    if then == now:
        return None
    return (f"{path} on node {layout.names[node]} is node {marker.get('node')}'s part of a checkpoint "
            f"saved on {then['nodes']} nodes ({then['world_size']} ranks, its ranks {then['ranks']}), "
            f"and this run has {now['nodes']} nodes ({now['world_size']} ranks, here {now['ranks']}): "
            "resume on the same nodes, or from a mirror")


def write_marker(directory: Path, step: int, engine: str, layout: Layout) -> None:
    """A node's lead: write (and fsync) the ``COMPLETE`` marker of ``directory``, which records the mode, the
    world size and the node's ranks (what :func:`misfit` checks)."""
    node = layout.node_of[dist.get_rank()]
    with open(directory / MARKER, "w") as f:
        json.dump({"step": step, "world_size": dist.get_world_size(), "engine": engine, "time": time.time(),
                   "mode": "shared" if layout.shared else "node-local", "nodes": len(layout.names),
                   "node": node, "ranks": layout.ranks(node)}, f)
        f.flush()
        os.fsync(f.fileno())


def agreed_steps(layout: Layout, complete: Callable[[], list[Path]]) -> tuple[dict[int, set[int]], dict[int, set[int]]]:
    """node -> its complete steps, and node -> those of them saved on another topology (a node-local
    part whose ranks are not this node's now), as each node's lead sees them (``complete()``). Collective."""
    rank = dist.get_rank()
    mine = None
    if layout.lead(rank):
        done = complete()
        mine = ([step_of(p) for p in done], [step_of(p) for p in done if misfit(p, layout) is not None])
    props: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(props, mine)
    held = {layout.node_of[r]: set(p[0]) for r, p in enumerate(props) if p is not None}
    foreign = {layout.node_of[r]: set(p[1]) for r, p in enumerate(props) if p is not None}
    return held, foreign


def missing(step: int, per_node: dict[int, set[int]], layout: Layout) -> str:
    """``checkpoint step N is not complete on node 1 (name: no step_... in dir)``: the nodes that lack ``step``."""
    name = f"{PREFIX}{step:08d}"
    lacking = [f"node {n} ({layout.names[n]}: no {name} in {layout.dirs[n]})"
               for n in sorted(per_node) if step not in per_node[n]]
    return f"checkpoint step {step} is not complete on {', '.join(lacking)}"

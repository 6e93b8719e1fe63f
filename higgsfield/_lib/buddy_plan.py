"""Which step a run can resume from, given the checkpoint parts and buddy copies its nodes hold, and what must move.

Used by :mod:`higgsfield._lib.ckpt_buddy` when a node-local run loads: every node's
lead says what it holds (its own parts, ``step_*``, and the copies it keeps for its
ring neighbour, ``.replicas/``), and :func:`plan` picks the newest step of which
every part is held somewhere. Plain data and no torch, so the rule is tested alone.

Two cases, as the parts fit the nodes that load:

- **same shape** (the world size, the number of nodes and every node's ranks as
  saved): node ``n`` needs part ``n`` only. It may hold it itself (the normal
  resume), as a buddy copy (a spare took a lost node's place, and the survivor
  next to it in the ring kept that node's part), or get it from the node that does.
- **another shape** (fewer nodes, other ranks): every node needs every part,
  since each node's DCP ``.metadata`` is a valid global one and all the parts in
  one directory load on any number of ranks (:mod:`higgsfield._lib.ckpt_shards`).
  DeepSpeed's own format loads on its own world size only, so its steps never plan this way.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Held", "Move", "Plan", "plan"]


@dataclass(frozen=True)
class Held:
    """One part of one step that a node of this run holds, as its marker describes it."""

    node: int                # the node (of this run) that holds it
    step: int
    part: int                # the part's number: its node's index in the run that saved it
    parts: int               # how many parts the step has (the saving run's nodes)
    world_size: int          # the saving run's
    ranks: tuple[int, ...]   # the saving ranks of this part
    engine: str = "fsdp"
    copy: bool = False       # a buddy copy (``.replicas/``), not the node's own ``step_*``


@dataclass(frozen=True)
class Move:
    """Part ``part`` of the planned step goes from node ``src`` to node ``dst`` (their leads)."""

    part: int
    src: int
    dst: int


@dataclass(frozen=True)
class Plan:
    step: int
    same_shape: bool
    needs: tuple[tuple[int, ...], ...]   # node -> the parts it must hold to load
    moves: tuple[Move, ...]
    copies_used: tuple[tuple[int, int], ...]   # (node, part): buddy copies the load reads or sends

    @property
    def local(self) -> bool:
        """Every node loads its own part: the ordinary resume, nothing to move or put together."""
        return self.same_shape and not self.moves and not self.copies_used


def plan(held: list[Held], ranks_now: list[list[int]], newer_than: int | None = None) -> Plan | None:
    """The newest step (above ``newer_than``) whose every part some node holds, and how to bring each node
    what it needs; None if there is none. ``ranks_now``: node -> its ranks in the run that loads."""
    world_now = sum(len(r) for r in ranks_now)
    for step in sorted({h.step for h in held}, reverse=True):
        if newer_than is not None and step <= newer_than:
            break
        found = _plan_step(step, [h for h in held if h.step == step], ranks_now, world_now)
        if found is not None:
            return found
    return None


def _plan_step(step: int, held: list[Held], ranks_now: list[list[int]], world_now: int) -> Plan | None:
    first = held[0]
    if any((h.parts, h.world_size, h.engine) != (first.parts, first.world_size, first.engine) for h in held):
        return None   # parts of two different saves under one step number: trust neither
    by_part: dict[int, list[Held]] = {}
    for h in held:
        by_part.setdefault(h.part, []).append(h)
    if set(by_part) != set(range(first.parts)):
        return None
    shape = {p: by_part[p][0].ranks for p in by_part}
    same = (first.world_size == world_now and first.parts == len(ranks_now)
            and all(tuple(ranks_now[p]) == shape[p] for p in range(first.parts)))
    if not same and first.engine == "deepspeed":
        return None
    needs = tuple((n,) if same else tuple(range(first.parts)) for n in range(len(ranks_now)))
    moves: list[Move] = []
    used: set[tuple[int, int]] = set()
    for node, parts in enumerate(needs):
        for p in parts:
            here = [h for h in by_part[p] if h.node == node]
            if here:
                best = min(here, key=lambda h: h.copy)   # its own part before a copy of it
                if best.copy:
                    used.add((node, p))
                continue
            src = min(by_part[p], key=lambda h: (h.copy, h.node))
            if src.copy:
                used.add((src.node, p))
            moves.append(Move(part=p, src=src.node, dst=node))
    return Plan(step=step, same_shape=same, needs=needs, moves=tuple(moves), copies_used=tuple(sorted(used)))

"""Which nodes a run gets: the candidates in node-rank order, less the bad ones, up to the count asked.

One small pure function, so every reason to keep a node out (unreachable, drifted,
slow in the fabric preflight) goes through the same door and the user reads the
same line for each::

    pick = pick_nodes(["n1", "n2", "n3"], {"n2": "drifted: numpy 1.26.4 (others: 2.1.0)"}, count=2)
    pick.nodes         # ["n1", "n3"]
    pick.lines()       # ["passed over n2: drifted: numpy 1.26.4 (others: 2.1.0)"]

Bad nodes are passed over only when there are spare candidates (``count`` fewer than
the candidates); a run asked to use every candidate keeps them all, and the caller
decides what a bad node means then (``run`` refuses drift, and a node that cannot be
reached fails the start as before).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from higgsfield.contract.errors import ConfigError, RunError


class NotEnoughNodes(RunError):
    """Fewer healthy candidates than ``--nodes K`` (exit 2: leave fewer out, fix the nodes, or ask fewer)."""

    exit_code = 2


@dataclass(frozen=True)
class Pick:
    """The nodes a run gets (in node-rank order) and those passed over, each with its reason."""

    nodes: list[str]
    passed_over: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        return [f"passed over {node}: {reason}" for node, reason in self.passed_over.items()]


def exclude(names: Sequence[str], excluded: Sequence[str]) -> list[str]:
    """``names`` less ``excluded``; a name not among ``names`` is the user's typo: ConfigError (exit 2)."""
    unknown = [x for x in excluded if x not in names]
    if unknown:
        raise ConfigError(f"--exclude {','.join(unknown)}: no such node (the nodes are {', '.join(names)})")
    left = [n for n in names if n not in set(excluded)]
    if not left:
        raise ConfigError(f"--exclude {','.join(excluded)} leaves no node to run on")
    return left


def pick_nodes(candidates: Sequence[str], bad: Mapping[str, str], count: int | None = None) -> Pick:
    """The first ``count`` healthy ``candidates`` (all of them when ``count`` is None or not fewer).

    ``bad``: node -> why it should be kept out. With spare candidates, a bad one is passed
    over for the next healthy one; fewer healthy ones than ``count``: :class:`NotEnoughNodes`.
    """
    want = len(candidates) if count is None else count
    if want > len(candidates):
        raise NotEnoughNodes(f"--nodes {want}: only {len(candidates)} node(s) to pick from "
                             f"({', '.join(candidates)})")
    if want == len(candidates):
        return Pick(list(candidates))
    healthy = [n for n in candidates if n not in bad]
    if len(healthy) < want:
        why = "; ".join(f"{n}: {r}" for n, r in bad.items() if n in candidates)
        raise NotEnoughNodes(f"--nodes {want}: only {len(healthy)} of {len(candidates)} node(s) are healthy "
                             f"({why})")
    chosen = healthy[:want]
    last = candidates.index(chosen[-1])
    passed = {n: bad[n] for n in candidates[:last] if n in bad}
    return Pick(chosen, passed)

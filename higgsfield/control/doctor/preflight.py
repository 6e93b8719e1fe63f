"""``run --preflight`` (or ``preflight: true``): the fabric test before the run, and the slow nodes kept out.

The fabric test (:mod:`higgsfield.control.doctor.fabric`) runs on every candidate node (the
project's nodes less ``--exclude``). A node named slow, or the node the test failed on, is
bad; the run's nodes are then picked by the one door every reason to keep a node out goes
through (:func:`higgsfield.control.backends.pick.pick_nodes`): with ``--nodes K`` fewer than
the candidates, a bad node is passed over for the next healthy one and a line says so; a
run that needs every candidate keeps them, and a line says which is slow. The caller adds
the passed-over nodes to the run's ``--exclude``.

Use::

    pre = preflight(cfg, exclude=("n4",), count=2)
    pre.exclude      # ("n4", "n2"): run with these left out
    pre.lines        # ["passed over n2: slow in the fabric preflight: ..."]
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from higgsfield.contract.errors import RunError
from higgsfield.contract.fabric import FabricResult
from higgsfield.control.backends.pick import exclude as leave_out
from higgsfield.control.backends.pick import pick_nodes
from higgsfield.control.config import Config
from higgsfield.control.doctor.fabric import TIMEOUT_S, FabricFailed, fabric_test
from higgsfield.control.remote import select_nodes


@dataclass(frozen=True)
class Preflight:
    """What the preflight decided: the run's ``--exclude`` (the user's plus the passed over), lines to show."""

    exclude: tuple[str, ...]
    lines: list[str] = field(default_factory=list)
    result: FabricResult | None = None


def bad_nodes(result: FabricResult) -> dict[str, str]:
    """Node -> why it should be kept out: slow against the median, or a GPU that reports a fault."""
    bad = {o.node: f"slow in the fabric preflight: {o.line()}" for o in result.outliers}
    for n in result.per_node:
        for g in n.gpus or []:
            if not g.healthy:
                bad.setdefault(n.node, f"unhealthy in the fabric preflight: gpu{g.index}: {g.health}")
    return bad


def preflight(cfg: Config, *, exclude: tuple[str, ...] = (), count: int | None = None,
              timeout: float = TIMEOUT_S) -> Preflight:
    """Test the fabric of the run's candidate nodes and pick around the bad ones (its own event loop)."""
    names = [str(n.name) for n in cfg.nodes]
    exclude = tuple(cfg.node_name(x) for x in exclude)   # a host alone names its node
    candidates = leave_out(names, exclude) if exclude else names
    if len(candidates) < 2:
        return Preflight(exclude, [f"preflight: skipped, one node ({candidates[0]})"])
    nodes = select_nodes(cfg, names=candidates)
    try:
        result: FabricResult | None = asyncio.run(fabric_test(cfg, nodes, timeout=timeout))
    except FabricFailed as e:
        if e.node is None:
            raise RunError(f"preflight: {e}") from None
        result, bad = None, {e.node: f"failed the fabric preflight: {e}"}
    else:
        assert result is not None
        bad = bad_nodes(result)
    pick = pick_nodes(candidates, bad, count)
    lines = [f"preflight: {result.world_size} ranks, latency {result.latency_us:.0f} us, peak busbw "
             f"{result.peak_busbw_gbps:.3f} GB/s ({result.seconds:.1f}s)"] if result else []
    lines += pick.lines()
    kept = [n for n in bad if n in pick.nodes]
    if kept and result is None:
        raise RunError(f"preflight: {bad[kept[0]]}")
    lines += [f"{n} is in the run anyway (no spare node: --nodes asks every one): {bad[n]}" for n in kept]
    lines += [f"{n} is not among the run's nodes anyway: {bad[n]}" for n in bad
              if n not in pick.nodes and n not in pick.passed_over]
    return Preflight(tuple(exclude) + tuple(pick.passed_over), lines, result)

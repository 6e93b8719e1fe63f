"""The drift check of the SSH nodes: each node's facts (``invoker facts``), compared, and the run's nodes picked.

``run`` asks every candidate node once, concurrently, on the connections it opened for
the run anyway (one round trip, about the invoker's start-up: 0.1 s), before anything
starts anywhere. ``doctor`` asks the same through :func:`drift_report`.

Use::

    report = await drift_report(group, cfg)              # facts, differences, unreachable nodes
    group, plan, notes = await admit(group, cfg, plan)   # the run's nodes; NodesDrift when they differ
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from higgsfield.contract.drift import DriftReport, NodeFacts, NodesDrift, compare, drifted
from higgsfield.control.backends.nodes.output import invoke_reply
from higgsfield.control.backends.nodes.start import RunPlan
from higgsfield.control.backends.pick import pick_nodes
from higgsfield.control.config import Config
from higgsfield.control.remote import Group, Member, NodeResult


async def node_facts(group: Group, cfg: Config) -> list[NodeResult[NodeFacts]]:
    """Every member's :class:`NodeFacts` for a run of this project (a node that fails: its result's reason)."""
    async def one(m: Member) -> NodeFacts:
        return await invoke_reply(m.transport, cfg, ["facts", "--project", cfg.name, "--runtime", cfg.runtime,
                                                     "--node", m.name], NodeFacts)
    return await group.run(one, timeout=cfg.ssh.command_timeout)


async def drift_report(group: Group, cfg: Config) -> DriftReport:
    """The drift of ``group``'s nodes (those that did not answer are listed apart, not compared)."""
    results = await node_facts(group, cfg)
    return DriftReport.of([r.value for r in results if r.ok and r.value is not None],
                          {r.node: r.reason for r in results if not r.ok})


async def admit(group: Group, cfg: Config, plan: RunPlan,
                bad: Mapping[str, str] | None = None) -> tuple[Group, RunPlan, list[str]]:
    """The run's nodes out of ``plan.candidates`` (connected in ``group``), checked; lines to show the user.

    With spare candidates (``--nodes K`` fewer than the nodes left after ``--exclude``),
    a node that cannot be reached or is drifted is passed over for the next one, and a
    line says so. The nodes picked must not differ (:class:`NodesDrift`, exit 2) unless
    ``plan.allow_drift``, which shows the differences instead. A node that cannot be
    reached when there is no spare stays in: the start fails there, as it always did.
    ``bad``: more nodes to pass over, with their reasons (the fabric preflight's slow ones).
    """
    names = [m.name for m in group.members]
    spare = plan.count is not None and plan.count < len(names)
    if plan.allow_drift and not spare:
        return group, plan, []        # nothing to check or choose: not one round trip more
    report = await drift_report(group, cfg)
    keep_out = {**{n: f"unreachable ({why})" for n, why in report.unreachable.items()},
                **drifted(report.differences), **(bad or {})}
    pick = pick_nodes(names, keep_out, plan.count if spare else None)
    spares = [n for n in names if n not in pick.nodes and n not in keep_out][:plan.spares]
    left = compare([f for f in report.nodes if f.node in pick.nodes or f.node in spares])
    if left and not plan.allow_drift:
        raise NodesDrift(left)
    notes = pick.lines() + [f"nodes differ (--allow-drift): {d.line()}" for d in left]
    if plan.spares:
        notes.append(f"spare(s) standing by: {', '.join(spares) or 'none healthy'}"
                     + (f" (of {plan.spares} asked)" if len(spares) < plan.spares else ""))
    if pick.nodes + spares == names:
        return group, replace(plan, spares=len(spares)), notes
    by_name = {m.name: m for m in group.members}
    members = [Member(by_name[n].node, by_name[n].transport, i) for i, n in enumerate(pick.nodes + spares)]
    return Group(members), replace(plan, nodes=[m.node for m in members[:len(pick.nodes)]], spares=len(spares)), \
        notes

"""``higgsfield prune``: remove finished runs (their checkpoints when asked) and unused images from every node.

One call per node, all nodes at once (like :mod:`higgsfield.control.backends.nodes.kill`): each
node's invoker selects and removes by itself (:mod:`higgsfield.node.runs.prune`, which
also says what it never touches and why) and answers what went and the bytes freed.
A dry run is the same request, not applied, so it lists exactly what the real prune
removes. With ``--run`` every node is asked in a dry run first, so an unknown name or
an active run is refused (one line, exit 2) before anything is removed anywhere.

What is removed comes from the flags, or, with no selecting flag, from ``retention:`` in
higgsfield.yml (which deploy applies after each successful deploy, :func:`apply_retention`).

Use::

    policy = policy_for(cfg, older_than_s=30 * 86400, dry_run=True)
    result = prune(cfg, policy)
    for n in result.nodes: print(n.node, len(n.runs), n.freed_bytes)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

from higgsfield.contract.errors import NoSuchRun, RunError
from higgsfield.contract.prunespec import PrunePolicy
from higgsfield.contract.replies_disk import Kept, PrunedCheckpoint, PrunedImage, PrunedRun, PruneReply
from higgsfield.contract.units import human_bytes
from higgsfield.control.backends.nodes.output import invoke_reply
from higgsfield.control.backends.timeouts import step_timeout
from higgsfield.control.config import Config
from higgsfield.control.config.schema import RetentionConfig
from higgsfield.control.remote import Group, Member, NodeResult, Transport, open_group

PRUNE_S = 600.0
"""``invoker prune``: sizes and removes run directories, checkpoints and images (large ones take a while)."""


class PruneRefused(RunError):
    """A prune that would touch what it must not (an active run named by ``--run``), or selects nothing: exit 2."""

    exit_code = 2


@dataclass
class NodePrune:
    """What one node removed (or, in a dry run, would remove)."""

    node: str
    runs: list[PrunedRun] = field(default_factory=list)
    checkpoints: list[PrunedCheckpoint] = field(default_factory=list)
    images: list[PrunedImage] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    freed_bytes: int = 0

    @classmethod
    def of(cls, node: str, r: PruneReply) -> NodePrune:
        return cls(node, runs=list(r.runs), checkpoints=list(r.checkpoints), images=list(r.images),
                   kept=list(r.kept), skipped=list(r.skipped), missing=list(r.missing), notes=list(r.notes),
                   freed_bytes=r.freed_bytes)


@dataclass
class PruneResult:
    dry_run: bool
    nodes: list[NodePrune] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)   # (node, reason)

    @property
    def freed_bytes(self) -> int:
        return sum(n.freed_bytes for n in self.nodes)


def retention_policy(retention: RetentionConfig, *, dry_run: bool = False) -> PrunePolicy:
    """The policy ``retention:`` in higgsfield.yml names."""
    return PrunePolicy(older_than_s=retention.max_age_s, keep_runs=retention.keep_runs,
                       checkpoints=retention.checkpoints, images=retention.images, dry_run=dry_run)


def policy_for(cfg: Config, *, older_than_s: float | None = None, runs: tuple[str, ...] = (),
               images: bool = False, checkpoints: bool = False, dry_run: bool = False) -> PrunePolicy:
    """The request for ``higgsfield prune``: the selecting flags (``--older-than``, ``--run``, ``--images``)
    when any is given, else ``retention:``; ``--checkpoints`` adds checkpoints to either.
    PruneRefused when nothing selects anything."""
    if older_than_s is not None or runs or images:
        return PrunePolicy(older_than_s=older_than_s, runs=runs, checkpoints=checkpoints, images=images,
                           dry_run=dry_run)
    if cfg.retention is None:
        raise PruneRefused("nothing to prune by: give --older-than, --run or --images, or set retention: "
                           "(keep_runs, max_age) in higgsfield.yml")
    policy = retention_policy(cfg.retention, dry_run=dry_run)
    return replace(policy, checkpoints=policy.checkpoints or checkpoints)


async def prune_node(t: Transport, cfg: Config, policy: PrunePolicy) -> NodePrune:
    """``invoker prune`` on one node; what it removed."""
    got = await invoke_reply(t, cfg, ["prune", "--project", cfg.name], PruneReply, input=policy.to_json(),
                             timeout=PRUNE_S)
    return NodePrune.of(t.node, got)


async def prune_group(group: Group, cfg: Config, policy: PrunePolicy) -> PruneResult:
    """Prune every node of ``group`` at once; a node that fails is named in ``failed``, the others' results kept.

    With ``policy.runs``, a dry run first: a name no node knows raises NoSuchRun, a name
    that is queued or running somewhere raises PruneRefused, and nothing is removed.
    """
    def on_every_node(request: PrunePolicy) -> Any:
        async def one(m: Member) -> NodePrune:
            return await prune_node(m.transport, cfg, request)

        return group.run(one, timeout=step_timeout(cfg, PRUNE_S))

    if policy.runs:
        _refuse_named(policy, await on_every_node(replace(policy, dry_run=True)))
    results: list[NodeResult[NodePrune]] = await on_every_node(policy)
    return PruneResult(policy.dry_run, nodes=[r.value for r in results if r.ok and r.value is not None],
                       failed=[(r.node, r.reason) for r in results if not r.ok])


def _refuse_named(policy: PrunePolicy, results: list[NodeResult[NodePrune]]) -> None:
    """Raise when a run named by ``--run`` is on no node, or is queued, starting or running on one."""
    Group.check(results, "prune")   # every node must answer: a name cannot be called unknown otherwise
    nodes = [r.value for r in results if r.value is not None]
    for run in policy.runs:
        active = [(n.node, k.why) for n in nodes for k in n.kept if k.run == run]
        if active:
            where = ", ".join(node for node, _ in active)
            raise PruneRefused(f"run '{run}' is {active[0][1]} on {where}: prune never touches an active run "
                               f"(stop it with 'higgsfield kill {run}')")
        if all(run in n.missing for n in nodes):
            raise NoSuchRun(f"no run named '{run}' on any node (see 'higgsfield status')")


async def prune_async(cfg: Config, policy: PrunePolicy) -> PruneResult:
    async with open_group(cfg) as group:
        return await prune_group(group, cfg, policy)


def prune(cfg: Config, policy: PrunePolicy) -> PruneResult:
    """:func:`prune_group` on every node of the project, with its own event loop."""
    return asyncio.run(prune_async(cfg, policy))


async def apply_retention(t: Transport, cfg: Config) -> str | None:
    """After a deploy on one node: prune it as ``retention:`` says. One line saying what went (None: nothing),
    or a warning when the prune failed: a prune never fails a deploy. Nothing without ``retention:``."""
    if cfg.retention is None:
        return None
    try:
        done = await prune_node(t, cfg, retention_policy(cfg.retention))
    except Exception as e:  # noqa: BLE001 - any failure of the prune is a warning, never a failed deploy
        text = str(e).strip()
        return f"warning: retention: the prune failed: {text.splitlines()[0] if text else type(e).__name__}"
    if not (done.runs or done.images):
        return None
    return (f"retention: removed {len(done.runs)} run(s), {len(done.checkpoints)} checkpoint dir(s), "
            f"{len(done.images)} image(s), {human_bytes(done.freed_bytes)} freed")


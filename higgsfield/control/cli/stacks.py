"""``higgsfield stacks RUN``: what every rank of a run is doing, through the backend's seam.

A live run's stacks are taken now from every node at once (each rank dumps its own
threads on a signal: :mod:`higgsfield.node.runs.stacks`), a stalled one's are those saved
at the stall; grouped and named by :func:`higgsfield.contract.stacks.diagnose`.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import click

from higgsfield.control.cli._common import get_config, run_name
from higgsfield.control.cli._lines import clean

if TYPE_CHECKING:
    from higgsfield.control.backends.nodes import RunStatus
    from higgsfield.control.config import Config


@click.command()
@click.argument("target", metavar="EXPERIMENT|RUN", callback=run_name)
@click.option("--node", default=None, help="Only this node (its name, or its host when no other node shares it).")
@click.option("--rank", type=click.IntRange(min=0), default=None, help="Only this global rank.")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of every rank's stacks, innermost frame last.")
@click.pass_context
def stacks(ctx: click.Context, target: str, node: str | None, rank: int | None, as_json: bool) -> None:
    """What is every rank of a run doing right now? Its Python stacks, grouped, then in full.

    A live run's stacks are taken now, from every node at once (each rank dumps its own
    threads: no ptrace, no py-spy needed); a run that stalled shows the stacks saved at
    the stall. An experiment name means its latest run.
    """
    from higgsfield.contract.stacks import diagnose, render

    cfg = get_config(ctx)
    status, found = asyncio.run(_stacks(cfg, target, node=node, rank=rank))
    for n, why in found.unreachable.items():
        click.echo(f"warning: {clean(n)}: no stacks: {clean(why)}", err=True)
    if as_json:
        click.echo(json.dumps([_stack_json(s) for s in found.stacks], indent=2))
        return
    when = "saved at its stall" if found.saved else "taken now"
    click.echo(f"run {clean(status.run)} ({clean(status.state)}): {len(found.stacks)} rank(s), stacks {when}\n",
               err=True)
    d = diagnose(found.stacks, silent=list(found.unreachable))   # a node that gave none is named, as at a stall
    for line in render(found.stacks, d).splitlines():   # each line inert, as node text is
        click.echo(clean(line))


def _stack_json(s: Any) -> dict[str, Any]:
    """``stacks --json``'s shape of one rank: node, rank, pid, threads of frames (function, file, line)."""
    return {"node": s.node, "rank": s.rank, "pid": s.pid,
            "threads": [{"name": t.name, "frames": [{"function": f.function, "file": f.file, "line": f.line}
                                                    for f in t.frames]} for t in s.threads]}


async def _stacks(cfg: Config, target: str, *, node: str | None, rank: int | None) -> tuple[RunStatus, Any]:
    from higgsfield.control.backends import backend_for

    async with backend_for(cfg).session() as session:
        status = await session.find(target)
        return status, await session.stacks(status, node=node, rank=rank)

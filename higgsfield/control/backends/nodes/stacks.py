"""``higgsfield stacks`` on the SSH nodes: every rank's Python stack, from every node at once.

Each node's invoker answers ``invoker stacks`` (:class:`~higgsfield.contract.replies.StacksReply`):
its ranks' stacks taken now while the run is active there (each worker dumps its own
threads on a signal: no ptrace), else those it saved when the run stalled. The nodes are
asked concurrently over the command's open connections, so the wall time is one node's
(the budget: 16 ranks on 8 nodes within 5 s, ``bench/stacks_wall.py``). A node that
cannot be asked is named in the result; the others' stacks still show.

Use::

    async with connect(cfg) as group:
        found = await take_stacks(group, cfg, status)     # StacksResult
        print(render(found.stacks, diagnose(found.stacks)))
"""

from __future__ import annotations

from higgsfield.contract.errors import RunError
from higgsfield.contract.replies import StacksReply
from higgsfield.contract.runstatus import RunStatus
from higgsfield.control.backends.backend import NoStacks, StacksResult
from higgsfield.control.backends.nodes.output import invoke_reply
from higgsfield.control.config import Config
from higgsfield.control.remote import Group, Member

TAKE_S = 3.0
"""How long each node waits for its ranks' dumps (a rank that does not answer by then shows without a stack)."""
ASK_S = TAKE_S + 7.0
"""The whole question to one node: its dumps, plus the invoker's start and the round trip."""


async def take_stacks(group: Group, cfg: Config, status: RunStatus, *, node: str | None = None,
                      rank: int | None = None) -> StacksResult:
    """The stacks of ``status``'s ranks on its nodes (``node``, ``rank``: only those); :class:`NoStacks` when
    there are none (the run is not active and saved none at a stall)."""
    want = None if node is None else str(cfg.node(node).name)   # its host alone will do
    names = [str(cfg.node(n).name) for n in status.nodes if want is None or cfg.node(n).name == want]
    if not names:
        raise NoStacks(f"run '{status.run}' does not run on node '{node}' (nodes: {', '.join(status.nodes)})")
    members = [m for m in group.members if m.name in names]
    args = ["stacks", "--project", cfg.name, "--run", status.run, "--timeout", str(TAKE_S)]
    if rank is not None:
        args += ["--rank", str(rank)]

    async def one(m: Member) -> StacksReply:
        return await invoke_reply(m.transport, cfg, args, StacksReply, timeout=ASK_S)

    results = await Group(members).run(one, timeout=ASK_S + 2)
    replies = [r.value for r in results if r.ok and r.value is not None]
    unreachable = {r.node: r.reason for r in results if not r.ok}
    unreachable.update({n: "not connected" for n in sorted(set(names) - {m.name for m in members})})
    found = sorted((s for reply in replies for s in reply.ranks), key=lambda s: (s.rank, s.node))
    if not found:
        if unreachable:
            raise RunError(f"no stacks of run '{status.run}': "
                           + "; ".join(f"{n}: {why}" for n, why in unreachable.items()))
        raise NoStacks(_none(status, rank))
    return StacksResult(stacks=found, saved=any(reply.saved for reply in replies), unreachable=unreachable)


def _none(status: RunStatus, rank: int | None) -> str:
    if rank is not None:
        return f"run '{status.run}' has no rank {rank} with a stack (it is {status.state})"
    if status.active:
        return f"run '{status.run}' is {status.state} and has no rank to ask yet"
    return (f"run '{status.run}' is {status.state}, not running, and saved no stacks (only a run that stalled "
            "keeps them)")

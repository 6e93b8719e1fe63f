"""Stopping runs on every node: ``higgsfield kill`` and the clean-up of a failed start.

One call per node, all nodes at once: each node finds the matching runs itself and
stops them within a few seconds (SIGTERM, then SIGKILL; ``docker stop`` for
containers); a queued run leaves the queue. Kill takes no lock that a run, deploy or
another kill holds, so it never waits behind one.

Use::

    async with connect(cfg) as group:
        stopped = await kill_runs(group, cfg, "tiny_llama")   # a run, or an experiment's active runs
"""

from __future__ import annotations

from higgsfield.contract.errors import NoSuchRun, RunError
from higgsfield.contract.replies import KillReply, KillTargetReply
from higgsfield.contract.runstatus import RunStatus
from higgsfield.control.backends.nodes.output import invoke_reply
from higgsfield.control.backends.nodes.status import merge
from higgsfield.control.backends.timeouts import QUERY_S, step_timeout
from higgsfield.control.config import Config
from higgsfield.control.remote import Group, Member, NodeResult


async def stop_run(group: Group, cfg: Config, run: str, *, missing_ok: bool = False,
                   attempt: str | None = None) -> list[NodeResult[KillReply]]:
    """Kill ``run`` on every node of ``group``; with ``missing_ok`` a node without it answers {"missing": true}.

    With ``attempt`` (a failed start's clean-up) a node stops the run only if that start
    made its record there, and otherwise answers {"missing": true}: a run of the same
    name that another start holds is never touched.
    """
    extra = ["--missing-ok"] if missing_ok else []
    if attempt is not None:
        extra += ["--attempt", attempt]

    async def one(m: Member) -> KillReply:
        return await invoke_reply(m.transport, cfg, ["kill", "--project", cfg.name, "--run", run, *extra], KillReply,
                                  timeout=QUERY_S)

    return await group.run(one, timeout=step_timeout(cfg, QUERY_S))


async def kill_runs(group: Group, cfg: Config, target: str) -> list[RunStatus]:
    """Stop every active run named by ``target`` (a run, else an experiment's active runs) on ``group``'s nodes.

    Returns the killed runs' final status; raises GroupError (after stopping the
    rest) if a node can't be reached.
    """
    async def one(m: Member) -> KillTargetReply:
        return await invoke_reply(m.transport, cfg, ["kill", "--project", cfg.name, "--target", target],
                                  KillTargetReply, timeout=QUERY_S)

    results = await group.run(one, timeout=step_timeout(cfg, QUERY_S))
    records = [rec for r in results if r.ok and r.value for rec in r.value.killed]
    matched = sum(r.value.matched for r in results if r.ok and r.value)
    failed = [r for r in results if not r.ok]
    if not records:
        if failed:
            Group.check(results, f"kill {target}")
        if matched:
            raise RunError(f"'{target}' has no queued or running run (see 'higgsfield status')")
        raise NoSuchRun(f"no run or experiment named '{target}' (see 'higgsfield status')")
    if failed:
        Group.check(results, f"kill {target} (stopped on {len(results) - len(failed)} node(s))")
    return merge(records)

"""``higgsfield profile`` on the SSH nodes: every chosen rank of a live run profiled for N steps, traces home.

Each node of the run is asked at once (``invoker profile``: :mod:`higgsfield.node.runs.profile`);
each answers when its ranks have written their traces, listing them with size and sha256,
and the files come home over the same connections with pull's fetch (SFTP, or a copy on
``localhost``; checked against the node's sha256). Here, the traces become one merged
timeline and a summary per rank (:mod:`higgsfield.contract.traces`). A run that is not
active, or an unknown one, is one line, exit 2, before any node is asked to profile.

Use::

    result = await profile_run(cfg, "alpaca-1203", steps=3)
    # profiles/alpaca-1203/20261206-063000/  rank0.trace.json .. rank3.trace.json, merged.trace.json
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from higgsfield.contract.errors import RunError
from higgsfield.contract.profile import ProfileReply, RankDone, trace_name
from higgsfield.contract.runstatus import RunStatus
from higgsfield.contract.traces import TraceSummary, merge, summarize
from higgsfield.control.backends.nodes.output import invoke_reply
from higgsfield.control.backends.nodes.pull import RemoteFile, fetch, safe_rel
from higgsfield.control.backends.nodes.status import find_run
from higgsfield.control.config import Config
from higgsfield.control.remote import Group, Member, open_group

MERGED = "merged.trace.json"
STAMP = "%Y%m%d-%H%M%S"     # ./profiles/<run>/<stamp>/: one folder per profile
WAIT_S = 60.0
"""How long each node waits for its ranks (from the request to their last trace), by default."""


class ProfileError(RunError):
    """A run that cannot be profiled (ended, unknown, no such node or rank): one line, exit 2."""

    exit_code = 2


@dataclass
class RankResult:
    node: str
    done: RankDone
    trace: Path | None
    summary: TraceSummary | None


@dataclass
class ProfileResult:
    run: str
    dest: Path
    ranks: list[RankResult] = field(default_factory=list)
    merged: Path | None = None
    missing: list[str] = field(default_factory=list)          # "node/rank" that did not answer in time
    unreachable: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


async def profile_run(cfg: Config, target: str, *, steps: int = 3, node: str | None = None,
                      rank: int | None = None, memory: bool = False, dest: Path | None = None,
                      timeout: float = WAIT_S) -> ProfileResult:
    """Profile ``target``'s next ``steps`` steps on its ranks (``node``/``rank``: only those); see the module."""
    t0 = time.monotonic()
    async with open_group(cfg) as group:
        try:
            status = await find_run(group, cfg, target)
        except RunError as e:
            raise ProfileError(str(e)) from None
        result = await profile_group(group, cfg, status, steps=steps, node=node, rank=rank, memory=memory,
                                     dest=dest, timeout=timeout)
    result.seconds = time.monotonic() - t0
    return result


async def profile_group(group: Group, cfg: Config, status: RunStatus, *, steps: int = 3, node: str | None = None,
                        rank: int | None = None, memory: bool = False, dest: Path | None = None,
                        timeout: float = WAIT_S) -> ProfileResult:
    """:func:`profile_run` over ``group``'s open connections, ``status`` found (the dashboard's session)."""
    t0 = time.monotonic()
    if not status.active:
        raise ProfileError(f"run '{status.run}' is {status.state}, not running: only a live run can be profiled")
    members = _members(group, cfg, status, node)
    dest = dest or Path("profiles") / status.run / time.strftime(STAMP)
    result = await _ask(members, cfg, status, steps, rank, memory, timeout, dest)
    result.seconds = time.monotonic() - t0
    return result


def _members(group: Group, cfg: Config, status: RunStatus, node: str | None) -> list[Member]:
    want = None if node is None else str(cfg.node(node).name)
    names = [str(cfg.node(n).name) for n in status.nodes if want is None or cfg.node(n).name == want]
    if not names:
        raise ProfileError(f"run '{status.run}' does not run on node '{node}' (nodes: {', '.join(status.nodes)})")
    return [m for m in group.members if m.name in names]


async def _ask(members: list[Member], cfg: Config, status: RunStatus, steps: int, rank: int | None,
               memory: bool, timeout: float, dest: Path) -> ProfileResult:
    args = ["profile", "--project", cfg.name, "--run", status.run, "--steps", str(steps),
            "--timeout", str(timeout)] + (["--rank", str(rank)] if rank is not None else []) \
        + (["--memory"] if memory else [])

    async def one(m: Member) -> ProfileReply:
        return await invoke_reply(m.transport, cfg, args, ProfileReply, timeout=timeout + 15)

    results = await Group(members).run(one, timeout=timeout + 20)
    out = ProfileResult(run=status.run, dest=dest, unreachable={r.node: r.reason for r in results if not r.ok})
    jobs = []
    for r in results:
        reply = r.value if r.ok else None
        if reply is None:
            continue
        out.missing += [f"{r.node}/{k}" for k in reply.missing]
        for f in reply.files:
            if not safe_rel(f.path) or "/" in f.path:
                raise RunError(f"{r.node}: unexpected invoker output: a bad file {f.path[:120]!r}")
            jobs.append((r.node, RemoteFile(r.node, f"{reply.root.rstrip('/')}/{f.path}", f.path, f.size, f.sha256)))
        out.ranks += [RankResult(r.node, d, None, None) for d in reply.done]
    if not out.ranks and not out.missing and not out.unreachable:
        raise ProfileError(f"run '{status.run}' has no live rank " + (f"{rank} " if rank is not None else "")
                           + "to profile" + (" (it may be starting)" if rank is None else ""))
    by_name = {m.name: m for m in members}
    dest.mkdir(parents=True, exist_ok=True)
    await asyncio.gather(*(fetch(by_name[n].transport, f, dest / f.rel, lambda _n: None) for n, f in jobs))
    await asyncio.to_thread(_read_back, out)
    return out


def _read_back(out: ProfileResult) -> None:
    """Each rank's trace summarized, then every trace in one timeline (``merged.trace.json``)."""
    parts = []
    out.ranks.sort(key=lambda r: r.done.rank)
    for r in out.ranks:
        path = out.dest / trace_name(r.done.rank)
        if r.done.error or not path.is_file():
            continue
        try:
            trace = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        r.trace, r.summary = path, summarize(trace)
        parts.append((r.node, r.done.rank, trace))
    if parts:
        out.merged = out.dest / MERGED
        out.merged.write_text(json.dumps(merge(parts)))

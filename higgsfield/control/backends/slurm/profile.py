"""``higgsfield profile`` on a Slurm cluster: a live job's ranks profiled for N steps, through the login node.

An SSH node's invoker writes the profile request into the run's directory, where its ranks
read it once a second (:mod:`higgsfield.node.runs.profile`). A Slurm run's directory is in
the shared workdir, which its ranks on the compute nodes and the login node all see. So the
login node's invoker does exactly that (``higgsfield invoker --state-dir WORKDIR profile``):
it writes the request, waits until the chosen ranks that armed in the job's current start have
written their traces, and lists them with size and sha256. No ``srun`` step is needed, as it
is for ``stacks`` (a stack must be taken on the rank's own node, a request is a file): nothing
waits for Slurm to start a step, and a busy allocation is not asked for one. The traces come
home over the login node's connection with pull's fetch, are merged into one timeline and
summarized per rank exactly as an SSH run's (:mod:`higgsfield.control.backends.nodes.profile`).

Use::

    result = await profile_job(cluster, "lab", status, steps=3)   # cluster: a SlurmCluster on the login node
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from higgsfield.contract.layout import node_of_rank, ranks_of_node
from higgsfield.contract.profile import ProfileReply
from higgsfield.contract.runstatus import RunStatus
from higgsfield.control.backends.nodes.output import decode_reply
from higgsfield.control.backends.nodes.profile import (
    STAMP,
    WAIT_S,
    ProfileError,
    ProfileResult,
    RankResult,
    _read_back,
)
from higgsfield.control.backends.nodes.pull import RemoteFile, fetch, safe_rel
from higgsfield.control.backends.slurm.client import SlurmCluster, SlurmError
from higgsfield.control.config import Config

__all__ = ["WAIT_S", "profile_job", "profile_run"]


async def profile_job(cluster: SlurmCluster, project: str, status: RunStatus, *, steps: int = 3,
                      node: str | None = None, rank: int | None = None, memory: bool = False,
                      dest: Path | None = None, timeout: float = WAIT_S) -> ProfileResult:
    """Profile the job's next ``steps`` steps on its ranks (``node``/``rank``: only those); see the module."""
    t0 = time.monotonic()
    if not status.active:
        raise ProfileError(f"run '{status.run}' is {status.state}, not running: only a live run can be profiled")
    placed = await cluster.placement(project, status.run)
    if placed is None:
        raise ProfileError(f"run '{status.run}' has not started on its nodes yet: nothing to profile")
    hosts, nproc = list(placed.spec.nodes), placed.spec.nproc or 1
    ranks = [] if rank is None else [rank]
    if node is not None:
        if node not in hosts:
            raise ProfileError(f"run '{status.run}' does not run on node '{node}' (nodes: {', '.join(hosts)})")
        ranks = [r for r in ranks_of_node(hosts, nproc, node) if rank is None or r == rank]
        if not ranks:
            raise ProfileError(f"rank {rank} of run '{status.run}' is not on node '{node}'")
    argv = cluster.invoker_argv("profile", "--project", project, "--run", status.run, "--steps", str(steps),
                                "--timeout", str(timeout), *(a for r in ranks for a in ("--rank", str(r))),
                                *(["--memory"] if memory else []))
    t = cluster.transport
    res = await t.run(argv, check=False, timeout=timeout + 15)
    if not res.ok:   # the invoker's one line (exit 2: the run is not running, no such run)
        line = ((res.stderr or res.stdout).strip().splitlines() or ["no answer"])[-1].removeprefix("error: ")
        raise (ProfileError if res.exit_status == 2 else SlurmError)(f"profile on {t.node}: {line[:300]}")
    reply = decode_reply(t.node, res.stdout, ProfileReply)
    dest = dest or Path("profiles") / status.run / time.strftime(STAMP)
    out = ProfileResult(run=status.run, dest=dest)
    out.missing = [f"{node_of_rank(hosts, nproc, r) or '?'}/{r}" for r in reply.missing]
    out.ranks = [RankResult(node_of_rank(hosts, nproc, d.rank) or t.node, d, None, None) for d in reply.done]
    if not out.ranks and not out.missing:
        raise ProfileError(f"run '{status.run}' has no live rank " + (f"{rank} " if rank is not None else "")
                           + "to profile (it may be starting)")
    files = []
    for f in reply.files:
        if not safe_rel(f.path) or "/" in f.path:
            raise SlurmError(f"{t.node}: unexpected invoker output: a bad file {f.path[:120]!r}")
        files.append(RemoteFile(t.node, f"{reply.root.rstrip('/')}/{f.path}", f.path, f.size, f.sha256))
    dest.mkdir(parents=True, exist_ok=True)
    await asyncio.gather(*(fetch(t, f, dest / f.rel, lambda _n: None) for f in files))
    await asyncio.to_thread(_read_back, out)
    out.seconds = time.monotonic() - t0
    return out


async def profile_run(cfg: Config, target: str, *, steps: int = 3, node: str | None = None, rank: int | None = None,
                      memory: bool = False, dest: Path | None = None, timeout: float = WAIT_S) -> ProfileResult:
    """``higgsfield profile TARGET`` of a project on a Slurm cluster: the run found, then :func:`profile_job`."""
    from higgsfield.contract.errors import RunError
    from higgsfield.control.backends.nodes.status import resolve_target
    from higgsfield.control.remote import open_group

    if cfg.slurm is None:
        raise ProfileError(f"{cfg.path or 'higgsfield.yml'}: no slurm block")
    async with open_group(cfg.on_login_node()) as group:
        cluster = SlurmCluster(group.members[0].transport, cfg.slurm)
        try:
            status = resolve_target(await cluster.statuses(cfg.name), target)[0]
        except RunError as e:
            raise ProfileError(str(e)) from None
        return await profile_job(cluster, cfg.name, status, steps=steps, node=node, rank=rank, memory=memory,
                                 dest=dest, timeout=timeout)

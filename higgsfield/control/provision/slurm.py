"""The ``slurm`` setup step: the login node can submit runs, and the workdir is the compute nodes' too.

``setup`` on a project with a ``slurm:`` block provisions the login node (its config as
:meth:`~higgsfield.control.config.Config.on_login_node` gives it: the workdir is the state dir),
with these steps instead of the SSH nodes' (no sudo, no Docker on a cluster):

``slurm``
    check: sbatch, srun, squeue, scancel and sinfo are there; the partition exists; a
    job shaped like a run is accepted (``sbatch --test-only``: the account may use the
    partition, the time fits); the workdir is writable and known to be shared. A Slurm
    problem is the user's to fix in higgsfield.yml, so the check fails with the line
    that says which field; only the workdir is applied: created (0700), then one task
    on a compute node (``srun --immediate``) must read back what the login node wrote.
``invoker``
    this package in ``<workdir>/venv``, as on any node (no system paths, no sudo).

The project environment is deploy's, as for ``runtime: process`` nodes.
"""

from __future__ import annotations

import posixpath
import secrets

from higgsfield.contract.errors import StepFailed
from higgsfield.control.backends.slurm import preflight as pf
from higgsfield.control.config.slurm import SlurmConfig
from higgsfield.control.provision.context import NodeContext
from higgsfield.control.provision.step import Check, Step
from higgsfield.control.remote.probe import Read


def settings_of(ctx: NodeContext) -> SlurmConfig:
    if ctx.cfg.slurm is None:
        raise StepFailed("the slurm step needs a slurm block in higgsfield.yml")
    return ctx.cfg.slurm


class SlurmStep(Step):
    name = "slurm"
    title = "Slurm + workdir"

    def _workdir_ok(self, s: SlurmConfig) -> tuple[str, ...]:
        return ("test", "-d", s.workdir, "-a", "-w", s.workdir, "-a", "-f", pf.shared_mark(s))

    def reads(self, ctx: NodeContext) -> list[Read]:
        s = settings_of(ctx)
        return [Read(pf.WHICH), Read(pf.SINFO), Read(pf.test_only_argv(s)), Read(self._workdir_ok(s))]

    async def check(self, ctx: NodeContext) -> Check:
        s = settings_of(ctx)
        found = pf.commands((await ctx.read(pf.WHICH)).stdout)
        if not found.ok:
            raise StepFailed(f"{found.problem} -> fix: {found.fix}")
        parts = pf.parse_sinfo((await ctx.read(pf.SINFO)).stdout)
        part = pf.partition(s, parts)
        if not part.ok:
            raise StepFailed(f"{part.problem} -> fix: {part.fix}")
        test = await ctx.read(pf.test_only_argv(s))
        sub = pf.submit(s, test.ok, test.stdout, test.stderr)
        if not sub.ok:
            raise StepFailed(f"{sub.problem} -> fix: {sub.fix}")
        if not (await ctx.read(self._workdir_ok(s))).ok:
            return Check(False, f"workdir {s.workdir} not checked yet (writable, seen by the compute nodes)")
        return Check(True, f"{part.summary}; workdir {s.workdir} shared")

    async def apply(self, ctx: NodeContext) -> str:
        s = settings_of(ctx)
        r = await ctx.run(["mkdir", "-p", s.workdir], check=False)
        if not r.ok or not await ctx.ok(["test", "-w", s.workdir]):
            raise StepFailed(f"cannot create or write the workdir {s.workdir} on the login node "
                             "-> fix: set slurm.workdir to a directory of yours on the shared filesystem")
        await ctx.run(["chmod", "700", s.workdir])
        token = secrets.token_hex(16)
        pending = posixpath.join(s.workdir, f"{pf.SHARED_MARK}.{token[:8]}")
        await ctx.transport.put_bytes(f"{token}\n".encode(), pending, mode=0o600)
        try:
            seen = await ctx.run(list(pf.shared_argv(s, pending)), check=False, timeout=pf.SHARED_WAIT_S + 60)
            if not seen.ok:
                why = " ".join((seen.stderr or seen.stdout).split())[-300:] or f"exit {seen.exit_status}"
                raise StepFailed(f"no compute node could check the workdir {s.workdir} (srun: {why}) -> fix: "
                                 f"re-run setup when a node of partition {s.partition or '(default)'} is free")
            if seen.stdout.strip() != token:
                raise StepFailed(f"the workdir {s.workdir} is not shared: a compute node does not see what the "
                                 "login node wrote there -> fix: set slurm.workdir to a directory on the "
                                 "filesystem the compute nodes mount (e.g. /shared or /scratch)")
            await ctx.run(["mv", pending, pf.shared_mark(s)])
        finally:
            await ctx.run(["rm", "-f", pending], check=False)
        return f"workdir {s.workdir} created, a compute node reads it"

"""Run the setup steps on every node at once; each node proceeds on its own.

Use::

    report = await provision(cfg, steps=["docker", "invoker"], on_event=print)
    report.ok          # every node ready
    report.failures()  # ["gpu-2: docker: ... (full output: .higgsfield/logs/setup/gpu-2.log)"]

The nodes are a :class:`~higgsfield.control.remote.fanout.Group` (one per run, chosen by
:func:`~higgsfield.control.remote.fanout.select_nodes`). Per node: connect, verifying the host
key strictly, then each step in order: ``check``; if needed ``apply`` then ``verify``.
The checks read the node through one probe (every selected step's reads in one SSH
session, see :mod:`higgsfield.control.provision.context`), so a re-run where everything is in
place costs a node one session. A step whose prerequisite failed is ``not run``; a
failed node never stops the others (even an unexpected exception is that node's
result). ``on_event(node, step, state, detail)`` reports progress for a live view
(``state`` is "running" or an :class:`Outcome` value); an applied step's detail says
what was done (what its ``verify`` found goes to the node's log).

New host keys: ``host_keys`` is the :class:`~higgsfield.control.provision.trust.HostScan`
the user accepted (see :mod:`higgsfield.control.provision.trust`); its keys are pinned
before any node is contacted, and the nodes it could not reach are reported
without a second attempt. Without it, a node with no pinned key is refused at
connect, like everywhere else. With ``dry_run`` only the read-only checks run and
nothing changes here either: the accepted keys are trusted for this run only, none
is written.
"""

from __future__ import annotations

import contextlib
import re
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from higgsfield.contract.errors import ConfigError, ConnectError, HiggsfieldError
from higgsfield.control.provision.context import BASE_READS, NodeContext, NodeLog, SetupOptions
from higgsfield.control.provision.deploy_key import DeployKeyStep
from higgsfield.control.provision.invoker import InvokerStep
from higgsfield.control.provision.slurm import SlurmStep
from higgsfield.control.provision.step import Outcome, Step
from higgsfield.control.provision.system import BaseImageStep, DockerGroupStep, DockerStep, NvidiaStep, OsStep
from higgsfield.control.provision.trust import HostScan, pin_accepted, trusted_keys
from higgsfield.control.provision.wheels import Artifacts
from higgsfield.control.remote.fanout import Group, Member, select_nodes

if TYPE_CHECKING:
    from higgsfield.control.config import Config

STEPS: tuple[Step, ...] = (OsStep(), DockerStep(), DockerGroupStep(), NvidiaStep(), InvokerStep(),
                           DeployKeyStep(), BaseImageStep())
#: A Slurm cluster's login node (no sudo, no Docker): the cluster and the workdir, then the invoker there.
SLURM_STEPS: tuple[Step, ...] = (SlurmStep(), InvokerStep())
CONNECT = "connect"

Event = Callable[[str, str, str, str], None]


@dataclass
class StepResult:
    step: str
    outcome: Outcome
    detail: str = ""
    seconds: float = 0.0


@dataclass
class NodeReport:
    node: str
    rank: int
    steps: list[StepResult] = field(default_factory=list)
    log_path: Path | None = None
    fingerprint: str | None = None
    pinned_now: bool = False
    user: str | None = None
    """The login user on the node, once a step asked (so a report can merge notes that differ only in it)."""
    error: str | None = None
    """Why the node could not be reached (then every step is ``not run``)."""

    @property
    def ok(self) -> bool:
        return self.error is None and all(s.outcome.ok for s in self.steps)

    @property
    def unchanged(self) -> bool:
        """Ready with nothing changed: every step was already done, and no host key was pinned."""
        return self.ok and not self.pinned_now and all(s.outcome in (Outcome.DONE, Outcome.SKIPPED)
                                                       for s in self.steps)

    def failures(self) -> list[str]:
        where = f" (full output: {self.log_path})" if self.log_path else ""
        if self.error:
            return [f"{self.node}: {CONNECT}: {self.error}"]
        return [f"{self.node}: {s.step}: {s.detail}{where}" for s in self.steps if s.outcome == Outcome.FAILED]


@dataclass
class SetupReport:
    nodes: list[NodeReport]
    steps: list[str]
    dry_run: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.nodes)

    @property
    def unchanged(self) -> bool:
        return all(n.unchanged for n in self.nodes)

    def failures(self) -> list[str]:
        return [f for n in self.nodes for f in n.failures()]


def steps_for(cfg: Config) -> tuple[Step, ...]:
    """The steps of this project's machines: a Slurm login node's, or the SSH nodes'."""
    return SLURM_STEPS if cfg.slurm is not None else STEPS


def select_steps(names: Sequence[str] | None, catalog: Sequence[Step] = STEPS) -> list[Step]:
    """The steps named (in their declared order), or all of them."""
    if not names:
        return list(catalog)
    known = {s.name: s for s in catalog}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"unknown step {', '.join(unknown)} (steps: {', '.join(known)})")
    return [s for s in catalog if s.name in names]


def log_file(log_dir: Path, node: str) -> Path:
    return log_dir / (re.sub(r"[^A-Za-z0-9_.-]", "_", node) + ".log")


async def provision(cfg: Config, *, nodes: Sequence[str] | None = None, steps: Sequence[str] | None = None,
                    dry_run: bool = False, host_keys: HostScan | None = None, options: SetupOptions | None = None,
                    on_event: Event | None = None) -> SetupReport:
    """Set up the chosen nodes (default: all) with the chosen steps (default: all), concurrently.

    ``host_keys``: the scan whose new keys the user accepted (pinned first; see the module doc).
    """
    start = time.monotonic()
    opts = options or SetupOptions()
    chosen_steps = select_steps(steps, steps_for(cfg))
    chosen_nodes = select_nodes(cfg, names=nodes or ())
    log_dir = opts.log_dir or cfg.project_dir / ".higgsfield" / "logs" / "setup"
    artifacts = Artifacts(opts.cache_dir or cfg.project_dir / ".higgsfield" / "cache")
    emit = on_event or (lambda *_: None)

    # built up front: a config problem (e.g. no ssh.user) is one error before anything connects
    group = Group.of(cfg, chosen_nodes, trusted=trusted_keys(host_keys) if dry_run else None)
    if host_keys is not None and not dry_run:
        pin_accepted(cfg, host_keys.new)
    accepted = {k.node for k in host_keys.new} if host_keys else set()
    unreachable = dict(host_keys.failed) if host_keys else {}

    async def one(m: Member) -> NodeReport:
        return await _provision_node(cfg, m, chosen_steps, dry_run, opts, artifacts, log_file(log_dir, m.name), emit,
                                     pinned_now=m.name in accepted, unreachable=unreachable.get(m.name))

    try:
        results = await group.run(one)
    finally:
        await group.close()
    reports = [r.value if r.value is not None else
               _crashed(r.node, cfg.nodes.index(m.node), chosen_steps, log_file(log_dir, r.node), r.error, emit)
               for m, r in zip(group.members, results, strict=True)]
    return SetupReport(reports, [s.name for s in chosen_steps], dry_run, time.monotonic() - start)


def _crashed(name: str, rank: int, steps: list[Step], log_path: Path, e: BaseException | None,
             emit: Event) -> NodeReport:
    """The report of a node whose setup raised an unexpected exception (its traceback goes to its log)."""
    error = f"unexpected error: {type(e).__name__}: {e}"
    with contextlib.suppress(OSError):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as f:
            f.write(f"# {error}\n{''.join(traceback.format_exception(type(e), e, e.__traceback__)) if e else ''}")
    with contextlib.suppress(Exception):
        emit(name, CONNECT, Outcome.FAILED.value, error)
    return NodeReport(name, rank, [StepResult(s.name, Outcome.NOT_RUN, error) for s in steps], log_path, error=error)


async def _provision_node(cfg: Config, m: Member, steps: list[Step], dry_run: bool, opts: SetupOptions,
                          artifacts: Artifacts, log_path: Path, emit: Event, *, pinned_now: bool = False,
                          unreachable: str | None = None) -> NodeReport:
    name, transport = m.name, m.transport
    report = NodeReport(name, cfg.nodes.index(m.node), log_path=log_path)
    log = NodeLog(log_path)
    try:
        log.write(f"# higgsfield setup on {name} ({'dry run' if dry_run else 'apply'}), "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
        emit(name, CONNECT, "running", "")
        try:
            if unreachable is not None:  # the host-key scan could not reach it a moment ago
                raise ConnectError(name, unreachable)
            await transport.connect()
        except HiggsfieldError as e:
            report.error = str(getattr(e, "reason", e))
            log.write(f"# connect failed: {report.error}")
            emit(name, CONNECT, Outcome.FAILED.value, report.error)
            report.steps = [StepResult(s.name, Outcome.NOT_RUN, "node unreachable") for s in steps]
            for s in steps:
                emit(name, s.name, Outcome.NOT_RUN.value, "node unreachable")
            return report
        report.fingerprint = transport.fingerprint
        report.pinned_now = pinned_now
        verb = "trusted (dry run, not pinned)" if dry_run else "pinned"
        note = f"{verb} new host key {report.fingerprint}" if pinned_now else (report.fingerprint or "local")
        log.write(f"# connected: {note}")
        emit(name, CONNECT, Outcome.DONE.value, note)
        ctx = NodeContext(cfg, m.node, transport, log, opts, artifacts)
        ctx.reads = list(dict.fromkeys([*BASE_READS, *(r for s in steps for r in s.reads(ctx))]))
        selected = {s.name for s in steps}
        outcomes: dict[str, Outcome] = {}
        for step in steps:
            blocked = [n for n in step.needs if n in selected and not outcomes.get(n, Outcome.DONE).ok]
            if blocked:
                result = StepResult(step.name, Outcome.NOT_RUN, f"needs {', '.join(blocked)}")
            else:
                emit(name, step.name, "running", "")
                result = await _run_step(step, ctx, dry_run)
            outcomes[step.name] = result.outcome
            report.steps.append(result)
            emit(name, step.name, result.outcome.value, result.detail)
        report.user = ctx.facts.user
        return report
    finally:
        await transport.close()
        log.close()


async def _run_step(step: Step, ctx: NodeContext, dry_run: bool) -> StepResult:
    start = time.monotonic()
    ctx.log.write(f"\n## {step.name}: check")

    def done(outcome: Outcome, detail: str) -> StepResult:
        ctx.log.write(f"## {step.name}: {outcome.value}: {detail}")
        return StepResult(step.name, outcome, detail, time.monotonic() - start)

    try:
        check = await step.check(ctx)
        if check.skip:
            return done(Outcome.SKIPPED, check.detail)
        if check.done:
            return done(Outcome.DONE, check.detail)
        if dry_run:
            return done(Outcome.WOULD_APPLY, check.detail)
        ctx.log.write(f"## {step.name}: apply ({check.detail})")
        try:
            applied = await step.apply(ctx)
        finally:
            ctx.changed()  # the probe's answers are stale now: verify and the next checks probe again
        ctx.log.write(f"## {step.name}: verify")
        verified = await step.verify(ctx)
        ctx.log.write(f"## {step.name}: verified: {verified}")
        return done(Outcome.APPLIED, applied)
    except HiggsfieldError as e:
        return done(Outcome.FAILED, str(getattr(e, "reason", None) or e))
    except Exception as e:  # noqa: BLE001 - a bug in one step must not take down the other nodes
        ctx.log.write(traceback.format_exc())
        return done(Outcome.FAILED, f"{type(e).__name__}: {e}")

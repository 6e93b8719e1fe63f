"""Run the setup steps on every node at once; each node proceeds on its own.

Use::

    report = await provision(cfg, steps=["docker", "invoker"], on_event=print)
    report.ok          # every node ready
    report.failures()  # ["gpu-2: docker: ... (full output: .higgsfield/logs/setup/gpu-2.log)"]

Per node: connect (pinning the host key on first contact, refusing a changed one),
then each step in order: ``check``; if needed ``apply`` then ``verify``. A step whose
prerequisite failed is ``not run``; a failed node never stops the others (even an
unexpected exception is that node's result). With ``dry_run`` only the read-only
checks run and nothing changes here either: no key is unpinned (``repin`` is ignored)
and none is pinned. ``on_event(node, step, state, detail)``
reports progress for a live view (``state`` is "running" or an :class:`Outcome` value).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from higgsfield.errors import ConfigError, HiggsfieldError
from higgsfield.provision.context import NodeContext, NodeLog, SetupOptions
from higgsfield.provision.deploy_key import DeployKeyStep
from higgsfield.provision.invoker import InvokerStep
from higgsfield.provision.step import Outcome, Step
from higgsfield.provision.system import BaseImageStep, DockerGroupStep, DockerStep, NvidiaStep, OsStep
from higgsfield.provision.wheels import Artifacts
from higgsfield.remote.base import Transport
from higgsfield.remote.fanout import transport_for
from higgsfield.remote.hostkeys import PinnedHosts

if TYPE_CHECKING:
    from higgsfield.config import Config, NodeConfig

STEPS: tuple[Step, ...] = (OsStep(), DockerStep(), DockerGroupStep(), NvidiaStep(), InvokerStep(),
                           DeployKeyStep(), BaseImageStep())
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
    error: str | None = None
    """Why the node could not be reached (then every step is ``not run``)."""

    @property
    def ok(self) -> bool:
        return self.error is None and all(s.outcome.ok for s in self.steps)

    @property
    def unchanged(self) -> bool:
        return self.ok and all(s.outcome in (Outcome.DONE, Outcome.SKIPPED) for s in self.steps)

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


def select_steps(names: Sequence[str] | None) -> list[Step]:
    """The steps named (in their declared order), or all of them."""
    if not names:
        return list(STEPS)
    known = {s.name: s for s in STEPS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"unknown step {', '.join(unknown)} (steps: {', '.join(known)})")
    return [s for s in STEPS if s.name in names]


def select_nodes(cfg: Config, names: Sequence[str] | None) -> list[NodeConfig]:
    if not names:
        return list(cfg.nodes)
    chosen = {id(cfg.node(n)) for n in names}  # raises ConfigError for an unknown name
    return [n for n in cfg.nodes if id(n) in chosen]


def log_file(log_dir: Path, node: str) -> Path:
    return log_dir / (re.sub(r"[^A-Za-z0-9_.-]", "_", node) + ".log")


async def provision(cfg: Config, *, nodes: Sequence[str] | None = None, steps: Sequence[str] | None = None,
                    dry_run: bool = False, repin: Sequence[str] = (), options: SetupOptions | None = None,
                    on_event: Event | None = None) -> SetupReport:
    """Set up the chosen nodes (default: all) with the chosen steps (default: all), concurrently."""
    start = time.monotonic()
    opts = options or SetupOptions()
    chosen_steps = select_steps(steps)
    chosen_nodes = select_nodes(cfg, nodes)
    pins = PinnedHosts(cfg.known_hosts_path)
    for name in repin:
        node = cfg.node(name)  # an unknown name is a ConfigError, dry run or not
        if not node.is_local and not dry_run:
            pins.unpin(node.host, cfg.node_port(node))
    log_dir = opts.log_dir or cfg.project_dir / ".higgsfield" / "logs" / "setup"
    artifacts = Artifacts(opts.cache_dir or cfg.project_dir / ".higgsfield" / "cache")
    emit = on_event or (lambda *_: None)

    # built up front: a config problem (e.g. no ssh.user) is one error before anything connects
    transports = {id(n): transport_for(cfg, n, pin=not dry_run) for n in chosen_nodes}

    async def one(node: NodeConfig) -> NodeReport:
        rank = cfg.nodes.index(node)
        log_path = log_file(log_dir, str(node.name))
        try:
            return await _provision_node(cfg, node, rank, transports[id(node)], chosen_steps, dry_run, opts,
                                         artifacts, log_path, emit)
        except Exception as e:  # noqa: BLE001 - a bug or an unexpected error on one node must not stop the others
            return _crashed(node, rank, chosen_steps, log_path, e, emit)

    reports = await asyncio.gather(*(one(n) for n in chosen_nodes))
    return SetupReport(list(reports), [s.name for s in chosen_steps], dry_run, time.monotonic() - start)


def _crashed(node: NodeConfig, rank: int, steps: list[Step], log_path: Path, e: Exception,
             emit: Event) -> NodeReport:
    """The report of a node whose setup raised an unexpected exception (its traceback goes to its log)."""
    name = str(node.name)
    error = f"unexpected error: {type(e).__name__}: {e}"
    with contextlib.suppress(OSError):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as f:
            f.write(f"# {error}\n{traceback.format_exc()}")
    with contextlib.suppress(Exception):
        emit(name, CONNECT, Outcome.FAILED.value, error)
    return NodeReport(name, rank, [StepResult(s.name, Outcome.NOT_RUN, error) for s in steps], log_path, error=error)


async def _provision_node(cfg: Config, node: NodeConfig, rank: int, transport: Transport, steps: list[Step],
                          dry_run: bool, opts: SetupOptions, artifacts: Artifacts, log_path: Path,
                          emit: Event) -> NodeReport:
    name = str(node.name)
    report = NodeReport(name, rank, log_path=log_path)
    log = NodeLog(log_path)
    try:
        log.write(f"# higgsfield setup on {name} ({'dry run' if dry_run else 'apply'}), "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
        emit(name, CONNECT, "running", "")
        try:
            connect = getattr(transport, "connect", None)
            if connect is not None:
                await connect()
        except HiggsfieldError as e:
            report.error = str(getattr(e, "reason", e))
            log.write(f"# connect failed: {report.error}")
            emit(name, CONNECT, Outcome.FAILED.value, report.error)
            report.steps = [StepResult(s.name, Outcome.NOT_RUN, "node unreachable") for s in steps]
            for s in steps:
                emit(name, s.name, Outcome.NOT_RUN.value, "node unreachable")
            return report
        report.fingerprint = getattr(transport, "fingerprint", None)
        report.pinned_now = bool(getattr(transport, "pinned_now", False))
        note = f"pinned new host key {report.fingerprint}" if report.pinned_now else (report.fingerprint or "local")
        log.write(f"# connected: {note}")
        emit(name, CONNECT, Outcome.DONE.value, note)
        ctx = NodeContext(cfg, node, transport, log, opts, artifacts)
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
        applied = await step.apply(ctx)
        ctx.log.write(f"## {step.name}: verify")
        verified = await step.verify(ctx)
        return done(Outcome.APPLIED, f"{applied} ({verified})" if verified else applied)
    except HiggsfieldError as e:
        return done(Outcome.FAILED, str(getattr(e, "reason", None) or e))
    except Exception as e:  # noqa: BLE001 - a bug in one step must not take down the other nodes
        ctx.log.write(traceback.format_exc())
        return done(Outcome.FAILED, f"{type(e).__name__}: {e}")

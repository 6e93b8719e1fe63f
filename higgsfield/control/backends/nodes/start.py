"""Starting a run: validate, build each node's :class:`~higgsfield.contract.runspec.RunSpec`, launch node 0, then the rest.

Params are validated before any node is contacted (:func:`plan_run`). Node ranks
follow the order of ``nodes`` in higgsfield.yml. Node 0 starts first: its start binds
the run's coordinator port, which the other nodes are started with. If any node
fails to launch, what *this* start made is stopped on every node it reached (also
those that did not answer: one that timed out may have a supervisor running) and the
error names the failed nodes. A node whose slots are busy queues the run (state
``queued``); it starts by itself. Starting never follows the run (see
:mod:`higgsfield.control.backends.nodes.logs`).

A run's name is its own. Each start sends a random ``attempt`` token that the nodes
write into their records, and a failed start's clean-up stops only records of its own
attempt (:func:`higgsfield.node.runs.stop.kill_attempt`). A node that refuses because
the name belongs to a queued, starting or running run says so apart from other
failures; the start then fails with :class:`~higgsfield.contract.errors.RunNameInUse` (exit 2)
and the run holding the name is never touched. What this guarantees:

- each node holds at most one active run per name (its start lock), and only the
  start that made a record ever stops it on clean-up;
- two starts of one name at once: node 0 is started first and alone, so the start
  that loses there contacts no other node, and the winner runs whole on every node;
- starts that disagree on node 0 (two configs) may each win some nodes: both then
  fail and each stops only its own part; neither touches the other's.

Use::

    plan = plan_run(cfg, "tiny_llama", {"steps": "50"})     # no I/O; a bad param raises here
    async with connect(cfg, plan.nodes) as group:           # keep the group to follow the run
        handle = await launch(group, cfg, plan, secrets={"HF_TOKEN": "..."})

The CLI and the dashboard start through the backend seam
(:meth:`~higgsfield.control.backends.nodes.session.NodesSession.start`), which checks the
candidates first and then calls :func:`launch`.
"""

from __future__ import annotations

import json
import secrets as _random
import time
from dataclasses import dataclass, field
from typing import Any, NoReturn

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.errors import CommandError, ConfigError, RunError, RunNameInUse
from higgsfield.contract.layout import code_dir
from higgsfield.contract.noderuns import NodeRunView
from higgsfield.contract.notify import Notify
from higgsfield.contract.params import check_run_name, resolve
from higgsfield.contract.replies import NameInUseReply, StartReply
from higgsfield.contract.runspec import DEFAULT_MAX_RECOVERIES, Coordinator, RunSpec, StartRequest
from higgsfield.contract.stall_policy import StallPolicy
from higgsfield.contract.states import ACTIVE
from higgsfield.control.backends import pick
from higgsfield.control.backends.backend import RunHandle, recovery_settings, stall_settings
from higgsfield.control.backends.nodes.kill import stop_run
from higgsfield.control.backends.nodes.output import UPGRADE_HINT, invoke_reply
from higgsfield.control.backends.timeouts import START_S, step_timeout
from higgsfield.control.config import Config, NodeConfig
from higgsfield.control.project.discovery import find_experiment
from higgsfield.control.remote import Group, Member, NodeResult, select_nodes
from higgsfield.control.remote.invoker import node_state_dir
from higgsfield.control.secrets import notify as notify_settings


@dataclass(frozen=True)
class RunPlan:
    """A run checked and ready to launch: nothing has been sent to a node yet."""

    experiment: str
    module: str
    params: dict[str, Any]          # resolved and validated values
    run: str
    nodes: list[NodeConfig]         # in node-rank order
    max_restarts: int = 0
    exclusive: bool = False
    stall: StallPolicy = StallPolicy()
    """The node side's stall watchdog for this run (higgsfield.yml's, or the run's flags)."""
    candidates: list[NodeConfig] = field(default_factory=list)
    """The nodes the run may take (higgsfield.yml's, less ``--exclude``); empty: exactly ``nodes``."""
    count: int | None = None
    """``--nodes K``: with more candidates than K, an unreachable or drifted one is passed over."""
    allow_drift: bool = False
    """Run even when the nodes differ (:mod:`higgsfield.control.backends.nodes.drift`)."""
    min_nodes: int = 0
    """The fewest nodes the run goes on on after losing some (0: every node: a lost node fails the run)."""
    max_recoveries: int = DEFAULT_MAX_RECOVERIES
    spares: int = 0
    """Candidates after the run's nodes that stand by, holding their slots, to take a lost node's place."""

    @property
    def connect_to(self) -> list[NodeConfig]:
        """The nodes a session for this plan opens: every candidate, so a bad one can be passed over."""
        return self.candidates or self.nodes


def new_run_name(experiment: str) -> str:
    return f"{experiment}-{time.strftime('%Y%m%d-%H%M%S')}-{_random.token_hex(2)}"


def plan_run(cfg: Config, experiment: str, params: dict[str, Any], *, run_name: str | None = None,
             nodes: int | None = None, max_restarts: int = 0, exclusive: bool = False,
             stall: StallPolicy | None = None, exclude: tuple[str, ...] = (),
             allow_drift: bool = False, min_nodes: int | None = None,
             max_recoveries: int | None = None, spares: int | None = None) -> RunPlan:
    """Find ``experiment``, validate its params, the run name and the node count; raise before any I/O.

    ``stall`` None: higgsfield.yml's watchdog settings. ``exclude``: node names left out (an
    unknown one: ConfigError, exit 2); ``nodes`` then counts among the others. ``min_nodes``,
    ``max_recoveries`` and ``spares`` None: higgsfield.yml's. A flag that does not fit is refused;
    higgsfield.yml's ``spares`` are at most what ``nodes`` leaves, and its ``min_nodes`` at or above the
    run's size means every node (a project's standing policy, not this run's request)."""
    exp = find_experiment(cfg.project_dir / "src", experiment)
    values = resolve(exp.params, params, experiment)
    if run_name is not None:
        check_run_name(run_name)
    # a flag that does not fit is the user's to fix, like a bad --exclude: ConfigError, exit 2
    if max_restarts < 0:
        raise ConfigError("--max-restarts must be >= 0")
    candidates = _candidates(cfg, exclude)
    left = " left after --exclude" if exclude else ""
    if nodes is not None and not 1 <= nodes <= len(candidates):
        raise ConfigError(f"--nodes {nodes}: the project has {len(cfg.nodes)} node(s) in {cfg.path}"
                          + (f" ({len(candidates)}{left})" if exclude else ""))
    if spares is None:
        spares = min(cfg.spares, len(candidates) - 1 if nodes is None else len(candidates) - nodes)
    if spares and nodes is None and spares >= len(candidates):
        raise ConfigError(f"--spares {spares} leaves none of the {len(candidates)} node(s) of {cfg.path}{left} to "
                          f"run on: give 0 to {len(candidates) - 1}")
    if spares:
        nodes = len(candidates) - spares if nodes is None else nodes
        if nodes + spares > len(candidates):
            raise ConfigError(f"--spares {spares}: the run's {nodes} node(s) and its spares are more than the "
                              f"{len(candidates)} node(s) of {cfg.path}{left}")
    size = nodes or len(candidates)
    if min_nodes is not None and not 1 <= min_nodes <= size:
        raise ConfigError(f"--min-nodes {min_nodes}: the run has {size} node(s); give 1 to {size} (the fewest it "
                          "may go on on after losing some)")
    floor, recoveries = recovery_settings(cfg, size, min_nodes, max_recoveries)
    return RunPlan(experiment=experiment, module=exp.module, params=values,
                   run=run_name or new_run_name(experiment), nodes=candidates[:nodes],
                   max_restarts=max_restarts, exclusive=exclusive, stall=stall or stall_settings(cfg),
                   candidates=candidates, count=nodes, allow_drift=allow_drift,
                   min_nodes=floor, max_recoveries=recoveries, spares=spares)


def _candidates(cfg: Config, exclude: tuple[str, ...]) -> list[NodeConfig]:
    """higgsfield.yml's nodes, in node-rank order, less ``exclude`` (unknown names: one line, exit 2)."""
    if not exclude:
        return select_nodes(cfg)
    left = pick.exclude([str(n.name) for n in cfg.nodes], [cfg.node_name(x) for x in exclude])
    return select_nodes(cfg, names=left)


async def launch(group: Group, cfg: Config, plan: RunPlan, *,
                 secrets: dict[str, str] | None = None) -> RunHandle:
    """Start ``plan`` on ``group`` (its nodes, connected, in node-rank order); returns when every node started it."""
    if cfg.data:   # a node whose copy of a data: entry is stale is refused (exit 2) before anything starts
        from higgsfield.control.backends.nodes.data.check import refuse_stale

        await refuse_stale(cfg, group)
    members = [m.name for m in group.members]   # the run's nodes, then its spares (plan.spares of them)
    names = members[:len(members) - plan.spares]
    master_addr = _address(group.members[0].node)
    # a run that recovers may lose node 0: every member then knows where the next one listens
    recovers = plan.max_recoveries > 0 and (plan.spares > 0 or plan.min_nodes > 0)
    addresses = {m.name: _address(m.node) for m in group.members} if recovers and len(members) > 1 else {}
    token = _random.token_hex(32)  # authenticates the run's nodes to its coordinator; sent on stdin only
    submitted_at = time.time()  # the FIFO order of every node's queue
    attempt = _random.token_hex(8)  # marks what this start makes, so its clean-up stops nothing else
    notify = notify_settings(cfg)   # node 0's supervisor sends the run's events; an unset destination stops here

    def launcher(coordinator: Coordinator | None) -> Any:
        async def one(m: Member) -> StartReply:
            spec = RunSpec(
                project=cfg.name, experiment=plan.experiment, run=plan.run, module=plan.module,
                code_dir=_code_dir(cfg, m.node), params=plan.params, node=m.name, node_rank=m.rank,
                nodes=tuple(names), spares=tuple(members[len(names):]), master_addr=master_addr,
                submitted_at=submitted_at,
                nproc=_nproc(cfg, m.node), coordinator=coordinator, max_restarts=plan.max_restarts,
                runtime=cfg.runtime, exclusive=plan.exclusive, attempt=attempt,
                checkpoint_mirror=cfg.checkpoint.mirror or "", min_nodes=plan.min_nodes,
                max_recoveries=plan.max_recoveries, addresses=addresses, on_straggler=cfg.on_straggler.value,
                **plan.stall.spec_fields())
            payload = json.dumps(encode(StartRequest(spec, secrets=dict(secrets or {}), token=token,
                                                     notify=notify if m.rank == 0 or addresses else Notify())))
            try:
                return await invoke_reply(m.transport, cfg, ["start"], StartReply, input=payload)
            except CommandError as e:
                refusal = _name_in_use(e, plan.run, m.name)
                if refusal is None:
                    raise
                raise refusal from None
        return one

    # Node 0 first: its start binds the run's coordinator port, which the others are started with.
    timeout = step_timeout(cfg, START_S)
    results = await group[:1].run(launcher(None), timeout=timeout)
    port = results[0].value.coord_port if results[0].ok and results[0].value else None
    if results[0].ok and not port:
        results[0] = NodeResult(names[0], 0, error=RunError(
            f"the invoker on {names[0]} started no run coordinator ({UPGRADE_HINT})"))
    if results[0].ok and len(members) > 1:
        coordinator = Coordinator(host=master_addr, port=int(port or 0), node=names[0])
        results += await group[1:].run(launcher(coordinator), timeout=timeout)
    if any(not r.ok for r in results):
        await _clean_up(group, cfg, plan.run, attempt, results)
    records: list[NodeRunView] = [r.value for r in results if r.value is not None]   # decoded once, by invoke_reply
    return RunHandle(cfg.name, plan.experiment, plan.run, members, records)


def _address(node: NodeConfig) -> str:
    """A node's address as the run's other nodes reach it (its rendezvous and, as node 0, its coordinator)."""
    return "127.0.0.1" if node.is_local else node.host


def _name_in_use(err: CommandError, run: str, node: str) -> RunNameInUse | None:
    """The node's refusal of a name an active run holds ({"name_in_use": true} on its stdout), else None."""
    try:
        reply = decode(NameInUseReply, json.loads(err.stdout)) if err.stdout else None
    except (ValueError, DecodeError):
        return None
    if reply is None:
        return None
    return RunNameInUse(run, reply.state if reply.state in ACTIVE else "active", node)


async def _clean_up(group: Group, cfg: Config, run: str, attempt: str,
                   results: list[NodeResult[Any]]) -> NoReturn:
    """Stop what this start made on every node it reached, and nothing else; raise the error naming what failed.

    A node that refused the name made nothing; any other node this start reached may
    have (one that timed out may have a supervisor running), so it is asked to stop
    the run only if ``attempt`` made its record there.
    """
    refused = [r for r in results if isinstance(r.error, RunNameInUse)]
    failed = [r for r in results if not r.ok and r not in refused]
    reached = {r.node for r in results if r not in refused}
    kills = await stop_run(Group([m for m in group.members if m.name in reached]), cfg, run, missing_ok=True,
                           attempt=attempt) if reached else []
    stopped = [k.node for k in kills if k.ok and k.value and not k.value.missing]
    unkilled = "; ".join(f"{k.node}: {k.reason}" for k in kills if not k.ok)
    detail = "; ".join(f"{r.node}: {r.reason}" for r in failed)
    if refused:
        first = refused[0].error
        assert isinstance(first, RunNameInUse)
        raise RunNameInUse(run, first.state, ", ".join(r.node for r in refused),
                           (f"; it also failed on {detail}" if detail else "")
                           + (f" (this start was stopped on {', '.join(stopped)})" if stopped else "")
                           + (f"; could not stop this start on {unkilled} (see 'higgsfield status')"
                              if unkilled else ""))
    raise RunError(f"run '{run}' failed to start on {len(failed)} node(s): {detail}"
                   + (f" (stopped it on {', '.join(stopped)})" if stopped else "")
                   + (f"; could not stop it on {unkilled} (run 'higgsfield kill {run}')" if unkilled else ""))


def _nproc(cfg: Config, node: NodeConfig) -> int | None:
    """Processes on ``node``: a number, or None for one per GPU (``auto``), which the node works out."""
    n = cfg.node_nproc(node)
    return None if n == "auto" else int(n)


def _code_dir(cfg: Config, node: NodeConfig) -> str:
    if node.is_local:
        return str(cfg.project_dir)
    return f"{node_state_dir(cfg)}/{code_dir(cfg.name)}"

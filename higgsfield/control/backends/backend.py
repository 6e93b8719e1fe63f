"""Where a project's runs happen, behind one typed contract: SSH nodes, or a Slurm cluster.

The CLI (``run``, ``status``, ``logs``, ``kill``, ``deploy``, ``ci ...``) talks to a
:class:`Backend`, never to the SSH fan-out or the Slurm engine directly, so a new place
to run (Kubernetes, later) is a new implementation of these three protocols (:class:`Backend`,
:class:`Session`, and :class:`Fleet` for the dashboard) and nothing else. Every backend speaks the
contract: a run is a :class:`~higgsfield.contract.runspec.RunSpec` going in and a
:class:`~higgsfield.contract.runstatus.RunStatus` coming out, its log lines are :class:`LogLine`
tagged ``node/rank``, its step metrics :class:`~higgsfield.metrics.StepMetrics`, so ``status --json``,
``logs -f``, ``metrics`` and the dashboard (:mod:`higgsfield.control.ui`) cannot tell which backend holds a run.

- :class:`~higgsfield.control.backends.nodes.backend.NodesBackend`: the nodes of higgsfield.yml
  over SSH (the functions of :mod:`higgsfield.control.backends.nodes`);
- :class:`~higgsfield.control.backends.slurm.backend.SlurmBackend`: one batch job per run on the
  cluster of the ``slurm:`` block, through its login node (:class:`higgsfield.control.backends.slurm.SlurmCluster`).

Use::

    backend = backend_for(cfg)                       # no I/O (higgsfield.control.backends.select)
    plan = backend.plan(RunRequest("alpaca", {"lr": "1e-4"}))   # a bad param raises here, before any connection
    async with backend.session(plan) as s:           # connections open once for the whole command
        handle = await s.start(plan, secrets={})
        async for line in s.follow(handle): ...
        final = await s.final_status(handle.run)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from higgsfield.contract.errors import ConfigError, RunError
from higgsfield.contract.noderuns import NodeRunView
from higgsfield.contract.runstatus import RunStatus
from higgsfield.contract.stacks import RankStacks
from higgsfield.contract.stall_policy import ON_STALL_CHOICES, OnStall, StallPolicy
from higgsfield.control.config import Config
from higgsfield.metrics import MetricsItem


@dataclass
class RunHandle:
    """A started run: its name and the nodes it runs on (in node-rank order)."""

    project: str
    experiment: str
    run: str
    nodes: list[str]
    records: list[NodeRunView] = field(default_factory=list)
    """Each node's record of its part, as its start answered (decoded; the Slurm job writes its own later)."""
    job_id: str | None = None
    """The scheduler's id of the run (a Slurm job), where a backend has one."""
    notes: list[str] = field(default_factory=list)
    """Lines for the user about how the nodes were chosen (a node passed over, drift allowed)."""


@dataclass
class NodeDeploy:
    """What deploy did on one node."""

    node: str
    commit: str | None = None
    shipped: bool = False
    image: str | None = None
    built: bool = False
    skipped_build: str | None = None
    env: str | None = None
    """The project environment's key (runtime: process), or None where runs use the image."""
    env_built: bool = False
    env_python: str | None = None
    seconds: float = 0.0
    build_seconds: float = 0.0
    env_seconds: float = 0.0
    retention: str | None = None
    """What ``retention:`` removed here after the deploy (or the warning its failure gave)."""


@dataclass
class DeployResult:
    commit: str
    dirty: bool
    archive_bytes: int
    nodes: list[NodeDeploy] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(frozen=True)
class LogLine:
    node: str
    rank: int          # global rank; -1 for the launcher (torchrun) itself, NOTICE for this side's notices
    text: str


class Plan(Protocol):
    """A run checked and ready to start (nothing sent anywhere yet)."""

    @property
    def run(self) -> str: ...

    @property
    def experiment(self) -> str: ...

    @property
    def params(self) -> dict[str, Any]:
        """The params resolved and typed (what the run will get)."""


@dataclass(frozen=True)
class RunRequest:
    """What ``run`` (or a workflow's form) asks for, before a backend checks it into its :class:`Plan`."""

    experiment: str
    params: Mapping[str, Any] = field(default_factory=dict)
    run_name: str | None = None
    nodes: int | None = None          # SSH: the first K nodes; Slurm: the allocation's node count
    max_restarts: int = 0             # SSH: torchrun restarts; Slurm: requeues (both resume from the checkpoint)
    exclusive: bool = False
    time: str | None = None           # Slurm only
    partition: str | None = None      # Slurm only
    stall_timeout: float | None = None   # the watchdog's settings; None: higgsfield.yml's (:meth:`stall`)
    startup_timeout: float | None = None
    on_stall: str | None = None
    exclude: tuple[str, ...] = ()     # nodes left out (SSH: of higgsfield.yml's; Slurm: sbatch --exclude)
    allow_drift: bool = False         # SSH: run even when the nodes differ (the drift check)
    min_nodes: int | None = None      # the fewest nodes the run goes on on after losing some (None: higgsfield.yml's)
    max_recoveries: int | None = None  # lost nodes it goes on after (None: higgsfield.yml's, by default 3)
    spares: int | None = None         # SSH: nodes after the run's that stand by to take a lost node's place
                                      # (None: higgsfield.yml's)

    def stall(self, cfg: Config) -> StallPolicy:
        """The watchdog's settings of this run: the request's, else higgsfield.yml's; ConfigError (exit 2) when bad."""
        return stall_settings(cfg, self.stall_timeout, self.startup_timeout, self.on_stall)


def stall_settings(cfg: Config, stall_timeout: float | None = None, startup_timeout: float | None = None,
                   on_stall: str | None = None) -> StallPolicy:
    """What the node side's stall watchdog does for one run (``RunSpec(..., **policy.spec_fields())``): the
    flags given, else higgsfield.yml's; a negative timeout or an unknown ``on_stall``: ConfigError.

    Every backend carries these into the spec its nodes (or its Slurm task) get, so the nodes
    find a hang by themselves, with the laptop gone.
    """
    stall = cfg.stall_timeout if stall_timeout is None else float(stall_timeout)
    startup = cfg.startup_timeout if startup_timeout is None else float(startup_timeout)
    for flag, v in (("--stall-timeout", stall), ("--startup-timeout", startup)):
        if not 0 <= v < float("inf"):
            raise ConfigError(f"{flag} must be a number of seconds >= 0 (0: off), not {v}")
    choice = cfg.on_stall if on_stall is None else on_stall
    if choice not in ON_STALL_CHOICES:
        raise ConfigError(f"--on-stall must be one of {', '.join(ON_STALL_CHOICES)}, not {choice!r}")
    return StallPolicy(stall, startup, OnStall(choice))


def recovery_settings(cfg: Config, size: int, min_nodes: int | None = None,
                      max_recoveries: int | None = None) -> tuple[int, int]:
    """``(min_nodes, max_recoveries)`` of one run on ``size`` nodes, as its spec carries them: the flags
    given, else higgsfield.yml's. A ``min_nodes`` at or above ``size`` is every node, 0 (a loss is no
    recovery on the survivors alone); each backend checks the flag's own range with its own words first."""
    floor = cfg.min_nodes if min_nodes is None else min_nodes
    return (0 if floor is None or floor >= size else floor,
            cfg.max_recoveries if max_recoveries is None else max_recoveries)


class NoStacks(RunError):
    """``stacks`` of a run that has none to show (not active, and none saved at a stall): one line, exit 2."""

    exit_code = 2


@dataclass(frozen=True)
class StacksResult:
    """What :meth:`Session.stacks` found: every rank's stack, taken now (a live run) or at its stall (``saved``).

    ``unreachable`` names the nodes that could not be asked (node -> why): the stacks of the
    others still show.
    """

    stacks: list[RankStacks]
    saved: bool = False
    unreachable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunList:
    """Every run of the project (oldest first) and where it could not be asked (node -> why)."""

    runs: list[RunStatus]
    unreachable: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)   # "node: skipped FILE: why", files a node could not decode


class Session(Protocol):
    """A backend with its connections open, for the length of one command."""

    async def start(self, plan: Any, secrets: Mapping[str, str] | None = None) -> RunHandle:
        """Start (or submit) ``plan``; returns once every node started it or the scheduler took it."""

    def follow(self, handle: RunHandle) -> AsyncIterator[LogLine]:
        """The run's log lines until it ends (waiting while it is queued)."""

    async def final_status(self, run: str) -> RunStatus:
        """The run's status once it ended (asked again for a short while if it still looks active)."""

    async def runs(self) -> RunList: ...

    async def find(self, target: str) -> RunStatus:
        """The run named ``target``, or an experiment's latest run; RunError when there is none."""

    def logs(self, status: RunStatus, *, follow: bool = False, node: str | None = None,
             ranks: tuple[int, ...] = (), since: float | None = None) -> AsyncIterator[LogLine]: ...

    def metrics(self, status: RunStatus, *, follow: bool = False) -> AsyncIterator[MetricsItem]:
        """Rank 0's step metrics in the order written (Skipped: a new total of bad lines; None: a heartbeat);
        with ``follow`` until the run ends."""

    async def kill(self, target: str) -> list[RunStatus]:
        """Stop the run ``target`` (or every active run of that experiment); their statuses after."""

    async def stacks(self, status: RunStatus, *, node: str | None = None, rank: int | None = None) -> StacksResult:
        """Every rank's Python stack (``node``/``rank``: only those): taken now from every node at once while
        the run is active, else the ones its nodes saved at its stall (``saved``). Raises :class:`NoStacks`
        (exit 2) when there are none: a run that ended without stalling."""

    async def profile(self, status: RunStatus, *, steps: int = 3, dest: Any = None) -> Any:
        """``higgsfield profile``: the run's ranks' next ``steps`` steps profiled, the traces in ``dest`` (default
        ``./profiles/RUN/TIME``); a ``ProfileResult`` (:mod:`higgsfield.control.backends.nodes.profile`). A run
        that is not running: one line, exit 2; a Slurm cluster: not yet (one line, exit 2)."""


#: How a :class:`Fleet` tells the dashboard what changed: ``"runs"`` (records, queue) or ``"node"`` (a machine).
Changed = Callable[[str], None]


class Fleet(Protocol):
    """The runs and machines of one backend, kept up to date for as long as the dashboard runs.

    The dashboard (:mod:`higgsfield.control.ui`) sees a backend's runs and machines only
    through this (:meth:`Backend.fleet` makes one); every action and every run page goes
    through the backend's own :class:`Session` (:meth:`session`). The shared words of the
    node view (``up``, ``down``, ...) are in :mod:`higgsfield.control.backends.fleet`.
    """

    label: str
    """What the dashboard runs against, in words (``3 node(s)``, ``Slurm partition gpu through login``)."""

    async def start(self) -> None:
        """Connect (a host key that is not the pinned one refuses the dashboard) and start watching."""

    async def close(self) -> None: ...

    def runs(self) -> list[RunStatus]:
        """Every run of the project, oldest first (a part that stopped answering: its last known runs)."""

    def nodes(self) -> list[dict[str, Any]]:
        """The node view's cards: name, host, state (up/down), reason, sample, history, queue."""

    def places(self, status: RunStatus) -> dict[str, Any]:
        """What the runs table adds to ``status``: ``stale_nodes``, per-node ``queue`` places, ``queue_position``."""

    def session(self, nodes: Sequence[str] | None = None) -> Session:
        """The backend's Session over the fleet's open connections (``nodes``: only those SSH nodes)."""

    def where(self, plan: Plan) -> str:
        """Where ``plan`` would run, in words (``on a, b`` / ``as a Slurm job of 2 node(s) on partition gpu``)."""

    def learn(self, handle: RunHandle) -> None:
        """A run the page just started: shown at once, before the next news from the backend."""

    def poke(self) -> None:
        """Something changed from here (a kill): look again now rather than at the next tick."""


class Backend(Protocol):
    """Where this project's runs happen: plans runs without I/O, opens sessions, deploys the code."""

    name: str
    cfg: Config

    def plan(self, request: RunRequest) -> Plan: ...

    def session(self, plan: Plan | None = None) -> AbstractAsyncContextManager[Session]:
        """Connected for one command: ``plan``'s nodes when starting a run, else every node the runs are on."""

    def deploy(self, *, dirty: bool = False, console: Any = None) -> DeployResult: ...

    def describe(self, handle: RunHandle) -> str:
        """Where a started run went, in words (``on gpu-1, gpu-2`` / ``as Slurm job 42``)."""

    def fleet(self, changed: Changed, *, sample_every: float | None = None, silent: float | None = None) -> Fleet:
        """What the dashboard watches for its whole life (no I/O until :meth:`Fleet.start`): ``changed`` is told
        of news; ``sample_every`` paces the machine samples (or Slurm's polls), ``silent`` is how long an SSH
        node may say nothing before it is shown down (both: the backend's defaults when None)."""

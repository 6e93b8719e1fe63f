"""The SSH nodes of higgsfield.yml as a :class:`~higgsfield.control.backends.backend.Backend`.

A thin wrapper over the functions of :mod:`higgsfield.control.backends.nodes`: :meth:`NodesBackend.plan`
is :func:`~higgsfield.control.backends.nodes.start.plan_run`, :meth:`NodesBackend.session` connects the
plan's nodes (:func:`~higgsfield.control.backends.nodes.connect.connect`, one
:class:`~higgsfield.control.remote.Group`) for a :class:`~higgsfield.control.backends.nodes.session.NodesSession`,
:meth:`NodesBackend.deploy` is :func:`~higgsfield.control.backends.nodes.deploy.deploy`, and
:meth:`NodesBackend.fleet` the dashboard's :class:`~higgsfield.control.backends.nodes.fleet.NodesFleet`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from higgsfield.contract.errors import ConfigError
from higgsfield.control.backends.backend import Changed, Fleet, Plan, RunRequest
from higgsfield.control.backends.nodes.connect import connect
from higgsfield.control.backends.nodes.deploy import DeployResult, deploy
from higgsfield.control.backends.nodes.fleet import NodesFleet
from higgsfield.control.backends.nodes.session import NodesSession
from higgsfield.control.backends.nodes.start import RunHandle, RunPlan, plan_run
from higgsfield.control.config import Config

__all__ = ["NodesBackend", "NodesSession"]


class NodesBackend:
    name = "nodes"

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def plan(self, request: RunRequest) -> RunPlan:
        for flag, value in (("--time", request.time), ("--partition", request.partition)):
            if value is not None:
                raise ConfigError(f"{flag} is for a Slurm cluster: {self.cfg.path or 'higgsfield.yml'} has no "
                                  "slurm block (this project runs on its SSH nodes)")
        return plan_run(self.cfg, request.experiment, dict(request.params), run_name=request.run_name,
                        nodes=request.nodes, max_restarts=request.max_restarts, exclusive=request.exclusive,
                        stall=request.stall(self.cfg), exclude=request.exclude,
                        allow_drift=request.allow_drift, min_nodes=request.min_nodes,
                        max_recoveries=request.max_recoveries, spares=request.spares)

    @asynccontextmanager
    async def session(self, plan: Plan | None = None) -> AsyncIterator[NodesSession]:
        nodes = plan.connect_to if isinstance(plan, RunPlan) else None
        async with connect(self.cfg, nodes) as group:
            yield NodesSession(self.cfg, group)

    def deploy(self, *, dirty: bool = False, console: Any = None) -> DeployResult:
        return deploy(self.cfg, dirty=dirty, console=console)

    def describe(self, handle: RunHandle) -> str:
        return f"on {', '.join(handle.nodes)}"

    def fleet(self, changed: Changed, *, sample_every: float | None = None, silent: float | None = None) -> Fleet:
        """The dashboard's view of the nodes: one feed per node, pushed over the connection it holds."""
        return NodesFleet(self.cfg, changed, every=sample_every, silent=silent)

"""``doctor --fabric``: a real collective benchmark over the nodes, started like a run.

The benchmark is the built-in experiment :mod:`higgsfield._lib.fabric_bench`, launched through
the SSH nodes' normal start (:func:`higgsfield.control.backends.nodes.start.launch`): the run's
runtime (its image or project venv), torchrun with the static rendezvous on node 0 in the
rendezvous range, the nodes' queue and the coordinator. Nothing is special-cased on the node
side, so a node that could not start a training run fails here too, and the figures are the
ones a run gets. It shows in ``status`` as a run of experiment ``higgsfield_fabric`` named
``fabric-<time>-<hex>``.

The worker prints its result as one line in rank 0's log; this module follows the run's
logs to that line and its end, decodes it (:class:`~higgsfield.contract.fabric.FabricResult`)
and names the slow node (:func:`~higgsfield.contract.fabric.outliers`). A run that fails or
does not end within the timeout is a :class:`FabricFailed` naming the node that failed first.

Use::

    result = await fabric_test(cfg, cfg.nodes)        # FabricResult, .outliers set
    result = run_fabric(cfg, nodes=3)                 # the same, with its own event loop
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from higgsfield.contract.codec import decode
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.errors import RunError
from higgsfield.contract.fabric import (
    EXPERIMENT,
    MARKER,
    MAX_BYTES,
    MODULE,
    PAIR_BYTES,
    FabricResult,
    outliers,
)
from higgsfield.control.backends.backend import Session
from higgsfield.control.backends.nodes.session import NodesSession
from higgsfield.control.backends.nodes.start import RunPlan
from higgsfield.control.backends.pick import NotEnoughNodes
from higgsfield.control.backends.slurm.backend import SlurmBackend
from higgsfield.control.backends.slurm.session import SlurmPlan
from higgsfield.control.config import Config, NodeConfig
from higgsfield.control.doctor import fabric_cache
from higgsfield.control.remote import open_group, select_nodes

TIMEOUT_S = 600.0
"""The whole test, queue wait included; past it the run is stopped and the test fails."""


class FabricFailed(RunError):
    """The benchmark run did not produce a result: ``node`` is the one that failed first (None: unknown)."""

    def __init__(self, message: str, node: str | None = None) -> None:
        super().__init__(message)
        self.node = node


def fabric_plan(cfg: Config, nodes: Sequence[NodeConfig], *, max_bytes: int = MAX_BYTES,
                pair_bytes: int = PAIR_BYTES, ckpt_mib: int = 64) -> RunPlan:
    """The benchmark as a run plan: the built-in experiment with its sizes; nothing is sent yet."""
    if max_bytes < 8:
        raise RunError(f"--max-bytes {max_bytes}: at least 8")
    run = f"fabric-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    return RunPlan(experiment=EXPERIMENT, module=MODULE,
                   params={"max_bytes": max_bytes, "pair_bytes": min(pair_bytes, max_bytes),
                           "min_bytes": 8, "ckpt_mib": ckpt_mib},
                   run=run, nodes=list(nodes))


async def _benchmark(session: Session, plan: Any, timeout: float, started: float) -> FabricResult:
    """Start ``plan`` on ``session`` (SSH nodes or a Slurm cluster alike), read its result line, check its end."""
    try:
        handle = await session.start(plan)
    except RunError as e:
        raise FabricFailed(f"the fabric test could not start: {e}") from None
    line: str | None = None
    tail: list[str] = []

    async def read() -> None:
        nonlocal line
        async for log in session.follow(handle):
            if log.text.startswith(MARKER):
                line = log.text[len(MARKER):]
            elif log.rank >= 0:
                tail[:] = [*tail[-4:], f"{log.node}/{log.rank}: {log.text}"]

    try:
        await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError:
        await session.kill(plan.run)
        raise FabricFailed(f"the fabric test did not end within {timeout:.0f}s (stopped run {plan.run})") from None
    status = await session.final_status(plan.run)
    if line is None or status.state != "succeeded":
        why = status.reason or (tail[-1] if tail else f"state {status.state}")
        raise FabricFailed(f"the fabric test failed on {status.failed_node or '?'}: {why} "
                           f"(see 'higgsfield logs {plan.run}')", status.failed_node)
    try:
        result = decode(FabricResult, json.loads(line))
    except (ValueError, DecodeError) as e:
        raise FabricFailed(f"the fabric test's result is unreadable: {e}") from None
    return replace(result, seconds=time.monotonic() - started, run=plan.run, outliers=outliers(result.pairs))


async def fabric_test(cfg: Config, nodes: Sequence[NodeConfig], *, timeout: float = TIMEOUT_S,
                      max_bytes: int = MAX_BYTES, pair_bytes: int = PAIR_BYTES) -> FabricResult:
    """Run the benchmark on the SSH ``nodes`` (node-rank order); its figures with the outliers named."""
    plan = fabric_plan(cfg, nodes, max_bytes=max_bytes, pair_bytes=pair_bytes)
    started = time.monotonic()
    async with open_group(cfg, plan.nodes) as group:
        result = await _benchmark(NodesSession(cfg, group), plan, timeout, started)
    fabric_cache.save(cfg, result)   # what 'run' prices a step's traffic on, with no network
    return result


async def slurm_fabric_test(cfg: Config, nodes: int | None = None, *, timeout: float = TIMEOUT_S,
                            max_bytes: int = MAX_BYTES, pair_bytes: int = PAIR_BYTES) -> FabricResult:
    """The same benchmark as a short job on the cluster's partition (``nodes``: sbatch -N, default slurm.nodes)."""
    backend = SlurmBackend(cfg)
    run = fabric_plan(cfg, [], max_bytes=max_bytes, pair_bytes=pair_bytes)
    settings = backend.settings.override(nodes=nodes, time=None, partition=None)
    plan = SlurmPlan(experiment=EXPERIMENT, module=MODULE, params=run.params, run=run.run, max_restarts=0,
                     settings=settings)
    started = time.monotonic()
    async with backend.session(plan) as session:
        result = await _benchmark(session, plan, timeout, started)
    fabric_cache.save(cfg, result)
    return result


def run_fabric(cfg: Config, nodes: int | None = None, *, names: Sequence[str] = (), timeout: float = TIMEOUT_S,
               max_bytes: int = MAX_BYTES) -> FabricResult:
    """:func:`fabric_test` on the first ``nodes`` (or those ``names``) with its own event loop; on a Slurm
    cluster, :func:`slurm_fabric_test` with ``nodes`` (``names`` do not apply there)."""
    if cfg.slurm is not None:
        if names:
            raise RunError("--node: a Slurm cluster picks its nodes; use --nodes K")
        return asyncio.run(slurm_fabric_test(cfg, nodes, timeout=timeout, max_bytes=max_bytes))
    chosen = select_nodes(cfg, nodes, names)
    if len(chosen) < 2:
        raise NotEnoughNodes(f"the fabric test needs at least 2 nodes ({len(chosen)} chosen)")
    return asyncio.run(fabric_test(cfg, chosen, timeout=timeout, max_bytes=max_bytes))

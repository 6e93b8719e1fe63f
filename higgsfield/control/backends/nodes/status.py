"""A run's status across its nodes: every node's records merged into one :class:`RunStatus`.

Each node keeps its own record of its part of a run (``invoker status``, decoded here
once into :class:`~higgsfield.contract.noderuns.NodeRuns`: typed views, and the node's skip lines
for files it could not decode); the run's
state is the merge: failed if any part failed, queued until every node admitted it,
and so on. The first failure is the one the nodes agree on (the run's coordinator
tells every node); when they disagree (a node cut off), the earliest wins.

Use::

    async with connect(cfg) as group:                 # the connections are reused by every call below
        runs, results = await query_runs(group, cfg)  # results: per node (the unreachable ones)
        status = await find_run(group, cfg, "tiny_llama")
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import replace

from higgsfield.contract.decode import DecodeError
from higgsfield.contract.errors import CommandError, NoSuchRun
from higgsfield.contract.nodepart import NodePart
from higgsfield.contract.noderuns import NodeRuns, NodeRunView, read_node_runs
from higgsfield.contract.runstatus import RunStatus
from higgsfield.contract.states import (
    ACTIVE,
    FAILED,
    KILLED,
    LOST,
    QUEUED,
    RUNNING,
    SPARE,
    STARTING,
    SUCCEEDED,
)
from higgsfield.control.backends.nodes.output import UPGRADE_HINT, invoke
from higgsfield.control.backends.timeouts import FINAL_POLL_S, FINAL_WAIT_S, QUERY_S, step_timeout
from higgsfield.control.config import Config
from higgsfield.control.remote import Group, Member, NodeResult


async def query_records(group: Group, cfg: Config) -> tuple[list[NodeRunView], list[NodeResult[NodeRuns]]]:
    """Every node's run records of this project (decoded), plus per-node results (unreachable nodes, and
    each node's skip lines: files it could not decode, :func:`skipped_lines`)."""
    async def one(m: Member) -> NodeRuns:
        reply = await invoke(m.transport, cfg, ["status", "--project", cfg.name], timeout=QUERY_S, expect=None)
        try:
            return read_node_runs(reply)
        except DecodeError as e:
            raise CommandError(m.name, f"unexpected invoker output: {e} ({UPGRADE_HINT})") from None

    results = await group.run(one, timeout=step_timeout(cfg, QUERY_S))
    records = [rec for r in results if r.ok and r.value for rec in r.value.runs]
    return records, results


def skipped_lines(results: list[NodeResult[NodeRuns]]) -> list[str]:
    """``node1: skipped runs/p/x/run.json: not JSON (...)``: each node's files that did not decode."""
    return [f"{r.node}: skipped {line}" for r in results if r.ok and r.value for line in r.value.skipped]


async def query_runs(group: Group, cfg: Config) -> tuple[list[RunStatus], list[NodeResult[NodeRuns]]]:
    """All runs of the project on ``group``'s nodes (oldest first), and the per-node query results."""
    records, results = await query_records(group, cfg)
    return merge(records), results


async def find_run(group: Group, cfg: Config, target: str) -> RunStatus:
    """The run named by ``target`` (a run, or an experiment: its latest run), asked of ``group``'s nodes."""
    runs, _ = await query_runs(group, cfg)
    return resolve_target(runs, target)[0]


async def final_status(group: Group, cfg: Config, run: str, *, wait: float = FINAL_WAIT_S) -> RunStatus:
    """``run``'s status once its records say it ended (or after ``wait`` seconds), over ``group``'s connections.

    When a followed run's log streams ended, every node's record already is final,
    so one question is enough; a node whose stream was lost may lag, so ask again
    every ``FINAL_POLL_S`` for a while.
    """
    deadline = time.monotonic() + wait
    status = await find_run(group, cfg, run)
    while status.state in ACTIVE and time.monotonic() < deadline:
        await asyncio.sleep(FINAL_POLL_S)
        status = await find_run(group, cfg, run)
    return status


def merge(records: Iterable[NodeRunView]) -> list[RunStatus]:
    """Node records (of any runs; decoded where they arrived: ``invoker status``, a start's or a kill's reply,
    the dashboard's feed) -> one status per run, oldest first."""
    by_run: dict[str, list[NodeRunView]] = {}
    for rec in records:
        by_run.setdefault(rec.run, []).append(rec)
    out = []
    for run, recs in by_run.items():
        recs.sort(key=lambda r: r.node_rank)
        lost = sorted({n for r in recs for n in r.lost})   # a node the run went on without: its part ended
        live = [r for r in recs if r.node not in lost and not r.spare] or recs
        state = _merged_state({r.state for r in live})
        first = first_failure(live) if state == FAILED else None
        failing = next((r for r in live if first and r.node == first.failed_node), None)
        starts = [r.started_at for r in recs if r.started_at]
        ends = [r.ended_at for r in recs if r.ended_at]
        codes = [r.exit_code for r in recs if r.exit_code]
        if failing is not None and failing.exit_code:
            codes.insert(0, failing.exit_code)  # the run's exit code: the failing node's
        out.append(RunStatus(
            project=recs[0].project, experiment=recs[0].experiment, run=run, state=state,
            nodes={r.node: replace(part_of(r), state=LOST if r.node in lost else SPARE) if r.node in lost or r.spare
                   else part_of(r) for r in recs},
            created_at=min(r.created_at for r in recs),
            started_at=min(starts) if starts else None,
            ended_at=max(ends) if ends and state not in ACTIVE else None,
            exit_code=codes[0] if codes else (0 if state == SUCCEEDED else None),
            failed_node=first.failed_node if first else None,
            failed_rank=first.failed_rank if first else None,
            reason=first.reason if first else None,
            error_tail=list(first.error_tail) if first else [],
            params=dict(recs[0].params), stragglers=next((list(r.stragglers) for r in live if r.stragglers), []),
            lost=lost, attempts=list(max(live, key=lambda r: len(r.attempts)).attempts)))
    return sorted(out, key=lambda s: s.created_at)


def part_of(view: NodeRunView) -> NodePart:
    """A node's part of a run, as its decoded record describes it."""
    return NodePart(state=view.state, slots=tuple(view.slots), nproc=view.nproc, exclusive=view.exclusive,
                    exit_code=view.exit_code, reason=view.reason, started_at=view.started_at,
                    ended_at=view.ended_at, stall=view.stall, stalled_at=view.stalled_at)


def _merged_state(states: set[str]) -> str:
    if FAILED in states:
        return FAILED
    if KILLED in states:
        return KILLED
    if states == {SUCCEEDED}:
        return SUCCEEDED
    if QUEUED in states:  # the run cannot make progress until every node started it
        return QUEUED
    if RUNNING in states or STARTING in states:
        return RUNNING if RUNNING in states else STARTING
    return sorted(states)[0]


def first_failure(recs: list[NodeRunView]) -> NodeRunView | None:
    """The record that names the run's first failure: every node records the coordinator's verdict,
    so they agree; when they do not (a node cut off), the earliest failure wins."""
    failed = [r for r in recs if r.state == FAILED]
    if not failed:
        return None
    named = [r for r in failed if r.failed_node]
    if named:
        return min(named, key=lambda r: (r.failed_at is None, r.failed_at or 0.0))
    return replace(failed[0], failed_node=failed[0].node)


def resolve_target(runs: list[RunStatus], target: str) -> list[RunStatus]:
    """The run named by ``target``: a run name, or an experiment (its latest run)."""
    exact = [r for r in runs if r.run == target]
    if exact:
        return exact
    of_exp = [r for r in runs if r.experiment == target]
    if not of_exp:
        raise NoSuchRun(f"no run or experiment named '{target}' (see 'higgsfield status')")
    return [of_exp[-1]]

"""``diagnose``: connect to every chosen node over SSH, probe it once, run the checks, report.

The SSH side of the doctor: the connection and its host key (a node that is not pinned, or
whose key changed, is refused before authentication and no check runs there), the one probe
session per node that answers every check (:mod:`~higgsfield.control.doctor.probe`), the
checks on its answers (:mod:`~higgsfield.control.doctor.checks`) and, meanwhile, the
rendezvous check across nodes (:mod:`~higgsfield.control.doctor.rendezvous`). Its own module
because it is the one part that talks to the nodes and holds the others together.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from higgsfield.contract.decode import DecodeError
from higgsfield.contract.errors import ConnectError, HostKeyError, HostNotPinnedError
from higgsfield.contract.noderuns import NodeRunView, read_node_runs
from higgsfield.control.backends.nodes.status import merge
from higgsfield.control.doctor.checks import (
    _clock,
    _disk,
    _docker,
    _environment,
    _gpus,
    _invoker,
    _slurm,
    _sudo,
    _usage,
)
from higgsfield.control.doctor.drift import check_drift
from higgsfield.control.doctor.probe import COMMAND_TIMEOUT_S, Facts, reads, runs_argv
from higgsfield.control.doctor.rendezvous import _rendezvous
from higgsfield.control.doctor.report import CheckName, DoctorReport, NodeDiagnosis, Probe
from higgsfield.control.remote.fanout import Group, Member, NodeResult, select_nodes
from higgsfield.control.remote.probe import Read, probe

if TYPE_CHECKING:
    from higgsfield.control.config import Config


async def diagnose(cfg: Config, nodes: Sequence[str] | None = None) -> DoctorReport:
    """Check the chosen nodes (default: all) concurrently; never raises for a node's problem."""
    start = time.monotonic()
    group = Group.of(cfg, select_nodes(cfg, names=nodes or ()))  # verify host keys, never pin
    diags = {m.name: NodeDiagnosis(m.name, cfg.nodes.index(m.node)) for m in group.members}
    records: list[NodeRunView] = []   # the project's runs, as each node's records say (read by the same probe)
    try:
        connected = await group.run(lambda m: _connect(cfg, m, diags[m.name]))
        up = Group([m for m, r in zip(group.members, connected, strict=True) if r.value])
        checked, _, drift = await asyncio.gather(up.run(lambda m: _check_node(cfg, m, diags[m.name], records)),
                                                 _rendezvous(cfg, group, up, diags),
                                                 check_drift(cfg, up, diags) if cfg.slurm is None else _none())
        results: list[NodeResult[Any]] = [*connected, *checked]
        for r in (r for r in results if not r.ok):  # the connection was lost, or a bug: that node's one problem
            diags[r.node].checks[CheckName.SSH] = Probe(False, "error", f"the checks could not run: {r.reason}")
    finally:
        await group.close()
    return DoctorReport(list(diags.values()), time.monotonic() - start, drift=drift, runs=merge(records))


async def _none() -> None:
    return None


async def _check_node(cfg: Config, m: Member, d: NodeDiagnosis, records: list[NodeRunView]) -> None:
    p = await probe(m.transport, [Read(a, timeout=COMMAND_TIMEOUT_S) for a in reads(cfg, m.node)], clock=True,
                    timeout=COMMAND_TIMEOUT_S + 10)
    if p.error is not None:  # every check reads the probe's answers: without python3 none can run
        d.checks[CheckName.SSH] = Probe(False, "no python3", f"cannot probe the node: {p.error}",
                                "install python3 on the node (higgsfield setup --step invoker does)")
        return
    facts = Facts(m.name, {r.argv: a for r, a in p.answers.items()}, p.uid, p.clock)
    if cfg.slurm is not None:
        d.checks[CheckName.CLOCK] = _clock(facts.clock)
        d.checks[CheckName.INVOKER] = _invoker(cfg, m.node, facts)
        d.checks[CheckName.ENVIRONMENT] = _environment(cfg, m.node, facts)
        d.checks[CheckName.USAGE] = _usage(cfg, m.node, facts)
        _slurm(cfg.slurm, facts, d)
        return
    d.checks[CheckName.SUDO] = _sudo(facts)
    d.checks[CheckName.DOCKER] = _docker(facts)
    d.checks[CheckName.GPUS] = _gpus(facts)
    d.checks[CheckName.DISK] = _disk(facts)
    d.checks[CheckName.CLOCK] = _clock(facts.clock)
    d.checks[CheckName.INVOKER] = _invoker(cfg, m.node, facts)
    d.checks[CheckName.ENVIRONMENT] = _environment(cfg, m.node, facts)
    d.checks[CheckName.USAGE] = _usage(cfg, m.node, facts)
    records.extend(_records(facts(runs_argv(cfg, m.node)).stdout))


def _records(stdout: str) -> list[NodeRunView]:
    """A node's run records from its ``invoker status`` (none when it did not answer as this release does)."""
    try:
        return list(read_node_runs(json.loads(stdout)).runs)
    except (ValueError, DecodeError):
        return []


async def _connect(cfg: Config, m: Member, d: NodeDiagnosis) -> bool:
    node, t = m.node, m.transport
    if node.is_local:
        d.checks[CheckName.SSH] = Probe(True, "local")
        d.checks[CheckName.HOST_KEY] = Probe(True, "-")
        return True
    port = cfg.node_port(node)
    start = time.monotonic()
    try:
        await t.connect()
    except HostNotPinnedError as e:
        d.checks[CheckName.SSH] = Probe(True, "reachable")
        d.checks[CheckName.HOST_KEY] = Probe(False, "not pinned", e.reason,
                                     "higgsfield setup (it shows the fingerprint and asks before pinning), "
                                     "then commit the known_hosts file")
        return False
    except HostKeyError as e:
        d.checks[CheckName.SSH] = Probe(True, "reachable")
        d.checks[CheckName.HOST_KEY] = Probe(False, "CHANGED", e.reason)  # the reason names the re-pin command
        return False
    except ConnectError as e:
        d.checks[CheckName.SSH] = Probe(False, "unreachable", e.reason,
                                f"check that the node is up and sshd listens on {node.host}:{port}; "
                                "ssh.user / identity_file in higgsfield.yml")
        return False
    d.checks[CheckName.SSH] = Probe(True, f"ok {time.monotonic() - start:.2f}s")
    # connected: the transport accepts pinned keys only
    d.checks[CheckName.HOST_KEY] = Probe(True, "matches", data={"fingerprint": t.fingerprint})
    return True

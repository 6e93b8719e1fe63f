"""The drift check inside a Slurm job: the allocation's nodes compared before torchrun starts.

On SSH nodes ``run`` compares the nodes from the laptop (``invoker facts``); on a cluster
the allocation is only known once the job runs, so each node's task
(:func:`higgsfield.node.slurm_task.node`) does it itself, in the shared run directory:

1. it writes its own :class:`~higgsfield.contract.drift.NodeFacts` (those of the job's
   interpreter, the project venv the job runs with, read as ``invoker facts`` reads one:
   dist-info names, no import of torch) to ``RUN_DIR/facts/<attempt>/<node>.json``;
2. it waits briefly (:data:`WAIT_S`) for every node of the allocation to have written its own;
3. it compares them (:func:`higgsfield.contract.drift.compare`) and writes the verdict
   (``drift.json``, a :class:`~higgsfield.contract.drift.DriftReport`) beside them: every
   task writes the same one (whole, by rename), so it is there even when srun's
   ``--kill-on-bad-exit`` ends the slower tasks as the first one stops.

On a difference every task stops before torchrun (exit :data:`DRIFT_EXIT`) and the batch
step records the run as failed, its error tail one line per difference (node, its value, the
majority's: what ``higgsfield status`` prints under the reason), unless the run was started with ``--allow-drift``: then the lines are printed
to the job's log and the run goes on. ``<attempt>`` is ``JOB.RESTART``: a requeued job may
land on other nodes, so it compares its own.

Use::

    report = check(rd, "1234.0", ["n1", "n2"], this_node="n2")
    report.differences           # [] on a healthy allocation
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from higgsfield import __version__
from higgsfield.contract.codec import decode, encode, rule
from higgsfield.contract.decode import DecodeError, read_json
from higgsfield.contract.drift import Difference, DriftReport, NodeFacts, report_json
from higgsfield.contract.layout import DRIFT_FACTS, DRIFT_VERDICT
from higgsfield.node.code.facts import gpus, nccl, packages, site_packages, torch_cuda
from higgsfield.node.state.records import RunDir

FACTS = DRIFT_FACTS   # RUN_DIR/facts/<attempt>/: contract.layout's
VERDICT = DRIFT_VERDICT
WAIT_S = 30.0
"""How long a task waits for the other nodes' facts (their tasks start within a second or two of each other)."""
POLL_S = 0.1
DRIFT_EXIT = 3
"""A node task's exit status when the nodes differ (the batch step then reads the verdict)."""


def job_facts(node: str) -> NodeFacts:
    """This node's facts for the job's interpreter: its venv's packages, Python, CUDA/NCCL; the driver and GPUs."""
    driver, model, count = gpus()
    prefix = Path(sys.prefix)
    site = site_packages(prefix) if sys.prefix != sys.base_prefix else None
    if site is None:
        site = next((Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()), None)
    pkgs = packages(site) if site else {}
    return NodeFacts(node=node, runtime="process", driver=driver, gpu_model=model, gpu_count=count,
                     invoker=__version__, python=".".join(str(x) for x in sys.version_info[:3]),
                     env_key=os.path.realpath(sys.prefix), torch=pkgs.get("torch"),
                     cuda=torch_cuda(site) if site else None, nccl=nccl(pkgs), packages=pkgs)


def attempt_dir(rd: RunDir, attempt: str) -> Path:
    return rd.path / FACTS / attempt


def _write(path: Path, data: dict[str, object]) -> None:
    """Whole or not at all: the other nodes poll for the file and must never read half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _read(path: Path) -> NodeFacts | None:
    try:
        return decode(NodeFacts, read_json(path))
    except (OSError, DecodeError, ValueError):
        return None


def gather(folder: Path, hosts: list[str], wait_s: float = WAIT_S) -> tuple[list[NodeFacts], list[str]]:
    """The facts of ``hosts`` (in their order) once all are written or ``wait_s`` passed; the nodes missing."""
    deadline = time.monotonic() + wait_s
    while True:
        found = {h: _read(folder / f"{h}.json") for h in hosts}
        missing = [h for h, f in found.items() if f is None]
        if not missing or time.monotonic() >= deadline:
            return [f for f in found.values() if f is not None], missing
        time.sleep(POLL_S)


def check(rd: RunDir, attempt: str, hosts: list[str], this_node: str, wait_s: float = WAIT_S) -> DriftReport:
    """Write this node's facts, wait for the others', compare, write the verdict."""
    folder = attempt_dir(rd, attempt)
    _write(folder / f"{this_node}.json", encode(job_facts(this_node)))
    facts, missing = gather(folder, hosts, wait_s)
    report = DriftReport.of(facts, {h: f"wrote no facts within {wait_s:.0f}s" for h in missing})
    _write(folder / VERDICT, report_json(report))
    return report


def verdict(rd: RunDir, attempt: str) -> list[Difference]:
    """The differences the nodes found in this attempt (none: no verdict, or a healthy allocation)."""
    try:
        return decode(_Verdict, read_json(attempt_dir(rd, attempt) / VERDICT)).differences
    except (OSError, DecodeError):
        return []


def _each_difference(v: object) -> list[Difference]:
    """The differences that decode (one damaged hides only itself)."""
    out: list[Difference] = []
    for d in v if isinstance(v, list) else []:
        try:
            out.append(decode(Difference, d))
        except DecodeError:
            continue
    return out


@dataclass(frozen=True)
class _Verdict:
    """What :func:`verdict` reads of ``drift.json`` (a :class:`DriftReport`): its differences."""

    WHAT: ClassVar[str] = "drift verdict"

    differences: list[Difference] = field(default_factory=list, metadata=rule(decode=_each_difference))


def reason(differences: list[Difference]) -> str:
    """The failed run's reason; its error tail is :func:`lines`, one line per difference."""
    n = len(differences)
    return (f"the nodes differ ({n} difference{'s' if n != 1 else ''}), stopped before training; "
            "--allow-drift runs anyway")


def lines(differences: list[Difference]) -> list[str]:
    """``n2: NVIDIA driver 535.104.05 (the other 1 node: none)``: the node, its value, the majority's."""
    return [d.line() for d in differences]

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
from pathlib import Path

from higgsfield import __version__
from higgsfield.contract.decode import DecodeError, read_json
from higgsfield.contract.drift import Difference, DriftReport, NodeFacts
from higgsfield.node.code.facts import gpus, nccl, packages, site_packages, torch_cuda
from higgsfield.node.state.records import RunDir

FACTS = "facts"
VERDICT = "drift.json"
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
        return NodeFacts.from_dict(read_json(path))
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
    _write(folder / f"{this_node}.json", job_facts(this_node).to_dict())
    facts, missing = gather(folder, hosts, wait_s)
    report = DriftReport.of(facts, {h: f"wrote no facts within {wait_s:.0f}s" for h in missing})
    _write(folder / VERDICT, report.to_dict())
    return report


def verdict(rd: RunDir, attempt: str) -> list[Difference]:
    """The differences the nodes found in this attempt (none: no verdict, or a healthy allocation)."""
    try:
        data = read_json(attempt_dir(rd, attempt) / VERDICT)
    except (OSError, DecodeError):
        return []
    items = data.get("differences") if isinstance(data, dict) else None
    out: list[Difference] = []
    for d in items if isinstance(items, list) else []:
        try:
            out.append(Difference(field=str(d["field"]), node=str(d["node"]), value=str(d["value"]),
                                  majority=str(d["majority"]), nodes=int(d.get("nodes") or 0)))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def reason(differences: list[Difference]) -> str:
    """The failed run's reason; its error tail is :func:`lines`, one line per difference."""
    n = len(differences)
    return (f"the nodes differ ({n} difference{'s' if n != 1 else ''}), stopped before training; "
            "--allow-drift runs anyway")


def lines(differences: list[Difference]) -> list[str]:
    """``n2: NVIDIA driver 535.104.05 (the other 1 node: none)``: the node, its value, the majority's."""
    return [d.line() for d in differences]

"""Every rank's stack of a Slurm job, through ``srun --overlap``: the command and what its tasks print.

A running job's ranks are on compute nodes only Slurm reaches: ``srun --overlap --jobid JOB
-N NODES --ntasks-per-node=1`` starts one more step inside the job's own allocation
(``--overlap``: beside the step that runs torchrun, not queued behind it), and its task on
each node (``python -m higgsfield.node.slurm_task stacks RUN_DIR``) signals that node's
ranks, whose faulthandlers dump their threads (no ptrace needed), and prints one JSON line::

    {"node": "n1", "ranks": [RankStacks dict, ...]}      or      {"node": "n1", "error": "why"}

srun cuts long lines into pieces of about 1 KiB, and the nodes' pieces interleave: with
``--label`` each piece says its task, and :func:`by_task` puts each node's line back together.

Both sides run it: the login node for ``higgsfield stacks`` (the control side's Slurm
client), and the job's own stall watchdog (:mod:`higgsfield.node.slurm_stall`), which saves
them in the run's ``stacks.json`` (:func:`parse_saved`). Neither side imports the other, so
the words live here, once.
"""


from __future__ import annotations

from collections.abc import Sequence

from higgsfield.contract.decode import DecodeError, loads
from higgsfield.contract.stacks import RankStacks

#: The Slurm task's module (what job scripts and the stacks step run on each node).
TASK_MODULE = "higgsfield.node.slurm_task"

#: Seconds the login node's srun may take (Slurm starts a step in well under one; each node's ranks have 3 s
#: to dump): a node that does not answer is named, the others' stacks still show.
SRUN_WAIT_S = 20.0


def srun_argv(job_id: str, nnodes: int, python: str, run_dir: str, *, wait: float = SRUN_WAIT_S) -> list[str]:
    """One ``stacks`` task on each of the job's ``nnodes`` nodes, beside its running step; ended after ``wait``."""
    return ["timeout", "-k", "2", f"{wait:g}", "srun", "--overlap", f"--jobid={job_id}", f"--nodes={nnodes}",
            "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--label", python, "-m", TASK_MODULE, "stacks", run_dir]


def by_task(out: str) -> list[str]:
    """Each task's output of a ``srun --label`` (``N: text`` lines), whole again: srun cuts a long line into
    pieces (about 1 KiB) that interleave with the other tasks', each piece labelled with its task."""
    parts: dict[str, list[str]] = {}
    for line in out.splitlines():
        label, sep, rest = line.partition(": ")
        if sep and label.strip().isdigit():
            parts.setdefault(label.strip(), []).append(rest)
    return ["".join(p) for _, p in sorted(parts.items(), key=lambda kv: int(kv[0]))]


def parse_srun(out: str, nodes: Sequence[str]) -> tuple[list[RankStacks], dict[str, str]]:
    """The ranks' stacks in the tasks' output, and ``node -> why`` for each of ``nodes`` that gave none."""
    found: list[RankStacks] = []
    answered: dict[str, str | None] = {}
    for line in by_task(out):
        try:
            data = loads(line)
            if not isinstance(data, dict) or not isinstance(data.get("node"), str):
                raise DecodeError("not an object with a 'node'")
            node = str(data["node"])
            if "error" in data:
                answered[node] = str(data["error"])[:500]
                continue
            ranks = data.get("ranks")
            if not isinstance(ranks, list):
                raise DecodeError("'ranks' is not a list")
            found.extend(RankStacks.from_dict(r) for r in ranks)
            answered[node] = None
        except (DecodeError, ValueError) as e:   # one bad line is named; the other nodes' stacks still count
            answered.setdefault("?", f"a stacks line that does not decode: {e}")
    missing = {n: "did not answer (its srun task gave no stacks)" for n in nodes if n not in answered}
    errors = {n: why for n, why in answered.items() if why is not None}
    return sorted(found, key=lambda s: (s.rank, s.node)), {**errors, **missing}


def parse_saved(text: str) -> list[RankStacks]:
    """``stacks.json`` (what the job saved at its stall): a list of RankStacks dicts; DecodeError otherwise."""
    data = loads(text)
    items = data.get("ranks") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise DecodeError("stacks.json is not a list of ranks' stacks")
    return sorted((RankStacks.from_dict(r) for r in items), key=lambda s: (s.rank, s.node))

"""Every rank's stack of a Slurm job, through ``srun --overlap``: the command and what its tasks print.

A running job's ranks are on compute nodes only Slurm reaches: ``srun --overlap --jobid JOB
-N NODES --ntasks-per-node=1`` starts one more step inside the job's own allocation
(``--overlap``: beside the step that runs torchrun, not queued behind it), and its task on
each node (``python -m higgsfield.node.slurm_task stacks RUN_DIR``) signals that node's
ranks, whose faulthandlers dump their threads (no ptrace needed), and prints one JSON line::

    {"node": "n1", "ranks": [RankStacks, ...]}      or      {"node": "n1", "error": "why"}      (NodeStacks)

srun cuts long lines into pieces of about 1 KiB, and the nodes' pieces interleave: with
``--label`` each piece says its task, and :func:`by_task` puts each node's line back together.

Both sides run it: the login node for ``higgsfield stacks`` (the control side's Slurm
client), and the job's own stall watchdog (:mod:`higgsfield.node.slurm_stall`), which saves
them in the run's ``stacks.json`` (:func:`parse_saved`). Neither side imports the other, so
the words live here, once.
"""


from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from higgsfield.contract.codec import decode, rule
from higgsfield.contract.decode import DecodeError, loads
from higgsfield.contract.stacks import RankStacks, SavedStacks

#: The Slurm task's module (what job scripts and the stacks step run on each node).
TASK_MODULE = "higgsfield.node.slurm_task"

#: Seconds the login node's srun may take (Slurm starts a step in well under one; each node's ranks have 3 s
#: to dump): a node that does not answer is named, the others' stacks still show.
SRUN_WAIT_S = 20.0


@dataclass(frozen=True)
class NodeStacks:
    """The ``stacks`` task's one line: a node's ranks' stacks, or why it has none (``error``)."""

    WHAT: ClassVar[str] = "stacks line"

    node: str = field(metadata=rule(check=lambda v: v[:253]))
    ranks: list[RankStacks] | None = field(default=None, metadata=rule(sparse=True))
    error: str | None = field(default=None, metadata=rule(check=lambda v: v[:500], sparse=True))

    def check(self) -> None:
        if self.ranks is None and self.error is None:
            raise ValueError("a stacks line with neither 'ranks' nor 'error'")


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
            got = decode(NodeStacks, loads(line))
        except DecodeError as e:   # one bad line is named; the other nodes' stacks still count
            answered.setdefault("?", f"a stacks line that does not decode: {e}")
            continue
        answered[got.node] = got.error
        if got.error is None and got.ranks is not None:
            found.extend(got.ranks)
    missing = {n: "did not answer (its srun task gave no stacks)" for n in nodes if n not in answered}
    errors = {n: why for n, why in answered.items() if why is not None}
    return sorted(found, key=lambda s: (s.rank, s.node)), {**errors, **missing}


def parse_saved(text: str) -> list[RankStacks]:
    """``stacks.json`` (what the job saved at its stall, :class:`SavedStacks`; an older job's: the list of ranks);
    DecodeError otherwise."""
    data = loads(text)
    saved = decode(SavedStacks, {"ranks": data} if isinstance(data, list) else data)
    return sorted(saved.ranks, key=lambda s: (s.rank, s.node))

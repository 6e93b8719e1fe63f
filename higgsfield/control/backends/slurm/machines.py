"""A Slurm partition's compute nodes as ``sinfo -N`` reports them: what the dashboard's node view shows.

On SSH nodes the dashboard samples each machine itself (``invoker stats``). On a cluster
nobody but Slurm may look at a compute node, so its view is Slurm's: the node's state
(idle, mixed, allocated, drained, down), its CPU load and memory as slurmd reports them,
its generic resources (the GPUs) and, for a node that is not usable, the reason an admin
or Slurm gave. A ``*`` after the state means slurmctld stopped hearing from the node.

Use::

    out = (await transport.run(sinfo_nodes_argv("gpu"))).stdout
    for n in parse_sinfo_nodes(out): ...     # ClusterNode("n1", "idle", cpus=64, ...)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# node|state (long)|CPUs|CPU load|memory MB|free memory MB|gres|reason; the reason last: it is free text
SINFO_NODES_FORMAT = "%N|%T|%c|%O|%m|%e|%G|%E"
#: States whose node takes no job: the page shows them as not usable, with Slurm's reason.
UNUSABLE = ("down", "drained", "draining", "fail", "failing", "future", "maint", "power_down", "powered_down",
            "unknown", "inval", "reboot_issued", "reboot_requested")
_GPU = re.compile(r"^gpu(?::[^:(]+)?:(\d+)")


@dataclass(frozen=True)
class ClusterNode:
    """One compute node of the partition, as Slurm sees it."""

    name: str
    state: str                    # Slurm's word, lower case, without its flags (idle, mixed, allocated, down ...)
    responding: bool = True       # False: sinfo flagged it '*' (slurmctld does not hear from it)
    cpus: int | None = None
    cpu_load: float | None = None  # the node's load average, as slurmd last reported it
    memory_mib: int | None = None
    free_mib: int | None = None
    gpus: int = 0
    gres: str = ""
    reason: str | None = None

    @property
    def usable(self) -> bool:
        return self.responding and not any(self.state.startswith(u) for u in UNUSABLE)


def sinfo_nodes_argv(partition: str | None) -> list[str]:
    """``sinfo -N`` of ``partition`` (None: every partition), one line per node, no header."""
    argv = ["sinfo", "-h", "-N", "-o", SINFO_NODES_FORMAT]
    if partition:
        argv += ["-p", partition]
    return argv


def parse_sinfo_nodes(out: str) -> list[ClusterNode]:
    """The nodes of :func:`sinfo_nodes_argv`'s output, each once (a node in two partitions is listed twice)."""
    nodes: dict[str, ClusterNode] = {}
    for line in out.splitlines():
        cols = line.strip().split("|", 7)
        if len(cols) != 8 or not cols[0]:
            continue
        name, state, cpus, load, mem, free, gres, reason = cols
        word = state.strip().lower()
        flags = word[len(word.rstrip("*~#!%$@^-+")):]
        gpus = sum(int(m.group(1)) for g in gres.split(",") if (m := _GPU.match(g.strip())))
        nodes.setdefault(name, ClusterNode(
            name=name, state=word.rstrip("*~#!%$@^-+"), responding="*" not in flags, cpus=_int(cpus),
            cpu_load=_float(load), memory_mib=_int(mem), free_mib=_int(free), gpus=gpus,
            gres="" if gres in ("(null)", "") else gres, reason=None if reason in ("none", "") else reason))
    return list(nodes.values())


def _int(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None   # N/A: slurmd has not reported yet

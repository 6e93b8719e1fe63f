"""Run records on a node: one directory per run, a JSON record, one log per rank.

::

    <state>/runs/<project>/<run>/
        spec.json        what to run (no secrets)
        run.json         the record: state, command, pids, container, slots, exit code, times
        kill             present once a kill was requested
        peer_lost.json   the control side lost another node of the run (the run ends failed, naming it)
        .lock            flock'd while a start checks and records the run
        logs/launcher.log, logs/rank<N>.log, logs/rank<N>.error.json

Secrets are never written here (nor anywhere on the node): they live only in the
run's processes' environments.

The record outlives the processes, so a finished run can be inspected later.
Writes are atomic (temp file + rename): a reader never sees half a record.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

QUEUED, STARTING, RUNNING = "queued", "starting", "running"
SUCCEEDED, FAILED, KILLED = "succeeded", "failed", "killed"
TERMINAL = frozenset({SUCCEEDED, FAILED, KILLED})
ACTIVE = frozenset({QUEUED, STARTING, RUNNING})


def write_json(path: Path, data: Any, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass
class RunRecord:
    """The state of one run on one node."""

    project: str
    experiment: str
    run: str
    node: str
    node_rank: int
    nnodes: int
    nproc: int
    state: str = QUEUED
    runtime: str = "process"
    command: list[str] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)
    pid_starts: dict[str, int] = field(default_factory=dict)  # role -> /proc start time (guards pid reuse)
    container: str | None = None
    image: str | None = None
    slots: list[int] = field(default_factory=list)     # GPU indices (or CPU slots) held while running
    exclusive: bool = False
    exit_code: int | None = None
    reason: str | None = None
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    ended_at: float | None = None
    failed_rank: int | None = None
    failed_at: float | None = None
    failed_node: str | None = None     # set when another node of the run was lost (by the control side)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunRecord:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)


class RunDir:
    """Paths of one run's directory."""

    def __init__(self, state_dir: Path, project: str, run: str) -> None:
        self.path = Path(state_dir) / "runs" / project / run

    @property
    def record_path(self) -> Path:
        return self.path / "run.json"

    @property
    def spec_path(self) -> Path:
        return self.path / "spec.json"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def kill_marker(self) -> Path:
        return self.path / "kill"

    @property
    def legacy_secrets_path(self) -> Path:
        """Where an older invoker's Docker runtime kept secrets; removed on sight."""
        return self.path / "secrets.json"

    @property
    def peer_lost_path(self) -> Path:
        """Written by a kill from the control side when another node of the run was lost."""
        return self.path / "peer_lost.json"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    def rank_error(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.error.json"

    def read(self) -> RunRecord:
        return RunRecord.from_dict(json.loads(self.record_path.read_text()))

    def write(self, record: RunRecord) -> None:
        write_json(self.record_path, record.to_dict())

    def spec(self) -> dict[str, Any]:
        return dict(json.loads(self.spec_path.read_text()))

    def exists(self) -> bool:
        return self.record_path.is_file()


def list_runs(state_dir: Path, project: str | None = None) -> list[RunDir]:
    root = Path(state_dir) / "runs"
    if not root.is_dir():
        return []
    out = []
    for pdir in sorted(root.iterdir()):
        if project and pdir.name != project:
            continue
        if not pdir.is_dir():
            continue
        for rdir in sorted(pdir.iterdir()):
            rd = RunDir(Path(state_dir), pdir.name, rdir.name)
            if rd.exists():
                out.append(rd)
    return out


def first_failure(rd: RunDir) -> tuple[int, float] | None:
    """(rank, time) of the earliest rank error recorded by the entrypoint, if any."""
    best: tuple[int, float] | None = None
    for p in rd.logs.glob("rank*.error.json"):
        try:
            d = json.loads(p.read_text())
            rank, t = int(d["rank"]), float(d["time"])
        except (OSError, ValueError, KeyError):
            continue
        if best is None or t < best[1]:
            best = (rank, t)
    return best


def reserved_ports(state_dir: Path) -> set[int]:
    """Rendezvous ports of this node's active runs that have their master here (node rank 0).

    A queued run has not bound its port yet; ``free-port`` must not hand it out again.
    """
    ports: set[int] = set()
    for rd in list_runs(state_dir):
        try:
            if rd.read().state not in ACTIVE:
                continue
            spec = rd.spec()
            if int(spec.get("node_rank", -1)) == 0 and spec.get("master_port"):
                ports.add(int(spec["master_port"]))
        except (OSError, ValueError, TypeError):
            continue
    return ports

"""Run records on a node: one directory per run, a JSON record, one log per rank.

::

    <state>/runs/<project>/<run>/
        spec.json        what to run (no secrets, no coordinator token)
        run.json         the record: state, command, pids, container, slots, ports, exit code, times,
                         and for a failed run the first failure (node, rank, reason, last lines of its error)
        kill             present once a kill was requested
        .lock            flock'd while a start checks and records the run
        logs/launcher.log, logs/rank<N>.log, logs/rank<N>.idx, logs/rank<N>.error.json, logs/rank<N>.done

Secrets are never written here (nor anywhere on the node): they live only in the
run's processes' environments. Everything here is private to the node user:
directories 0700, files 0600 (other users of a shared node read neither params nor logs).

The record outlives the processes, so a finished run can be inspected later. The
run states are :mod:`higgsfield.runspec`'s; ``spec.json`` is read with
:class:`higgsfield.invoker.placement.NodeRun`.
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

from higgsfield.runspec import FAILED, QUEUED, TERMINAL


def write_json(path: Path, data: Any, mode: int = 0o600) -> None:
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
    pid_starts: dict[str, int] = field(default_factory=dict)  # role -> start, ticks since boot (pids: reuse guard)
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
    failed_node: str | None = None     # the node of the run's first failure (the same on every node)
    error_tail: list[str] = field(default_factory=list)   # the last lines of that failure's error
    master_port: int | None = None     # the rendezvous port, chosen by node 0 when every node is admitted
    coord_port: int | None = None      # node 0: the port of the run's coordinator
    attempt: str | None = None         # the start that made this record (a failed start stops only its own)

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

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    def rank_error(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.error.json"

    def read(self) -> RunRecord:
        return RunRecord.from_dict(json.loads(self.record_path.read_text()))

    def write(self, record: RunRecord) -> None:
        write_json(self.record_path, record.to_dict())

    def make(self) -> None:
        """Create the run's directories, private to the node user (0700 up to the state dir)."""
        for d in (self.path.parent.parent, self.path.parent, self.path, self.logs):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            d.chmod(0o700)

    def exists(self) -> bool:
        return self.record_path.is_file()


def finish(rd: RunDir, state: str, rc: int | None = None, fail: dict[str, Any] | None = None) -> RunRecord:
    """Write the final record: ``state``, the exit code and, for a failed run, its first failure."""
    rd.legacy_secrets_path.unlink(missing_ok=True)  # left by an older invoker's docker runtime
    record = rd.read()
    record.ended_at = time.time()
    if rc is not None:
        record.exit_code = rc
    record.state = state
    if record.state == FAILED:
        fail = fail or {"node": record.node, "rank": None, "at": time.time(),
                        "reason": record.reason or f"torchrun exited {rc}", "tail": []}
        record.failed_node, record.failed_rank = fail.get("node"), fail.get("rank")
        record.failed_at = fail.get("at")
        record.reason = str(fail.get("reason") or record.reason or "failed")
        record.error_tail = [str(x) for x in fail.get("tail") or []]
    rd.write(record)
    return record


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

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
run states are :mod:`higgsfield.contract.runspec`'s; ``spec.json`` is read with
:class:`higgsfield.node.state.placement.NodeRun`.
Writes are atomic (temp file + rename): a reader never sees half a record.

Read back, a record is untrusted (a crash, a full disk or another tool may have left
anything): :meth:`RunDir.read` decodes it once, typed field by field, names checked as
if typed, the error tail bounded, and never through a symlink or out of the state dir
(:mod:`higgsfield.contract.decode`); :func:`scan_runs` lists the runs and names, one line
each, what it skipped, so one damaged file hides only its own run.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from higgsfield.contract import layout
from higgsfield.contract.codec import decode, encode, rule
from higgsfield.contract.decode import (
    TAIL_LINES,
    DecodeError,
    cut,
    is_plain_dir,
    read_json,
    skip_line,
    tail,
)
from higgsfield.contract.errors import RunError
from higgsfield.contract.failure import Failure
from higgsfield.contract.names import NAME_RE, check_node_name, is_run_name
from higgsfield.contract.stacks import Diagnosis
from higgsfield.contract.states import FAILED, QUEUED, STATES, TERMINAL
from higgsfield.contract.straggler import Straggler
from higgsfield.contract.text import has_control, one_line, shown
from higgsfield.node.state.home import NodeState


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


@dataclass(frozen=True)
class Attempt:
    """One start of a run's name on this node: its number, when, on which nodes, why, and where in each log
    file its output begins (the logs are appended to, attempt after attempt)."""

    WHAT: ClassVar[str] = "attempt"

    number: int
    at: float
    nodes: list[str]
    why: str                            # "first start" | "the name re-used" | "recovery N: NODE lost"
    logs: dict[str, int] = field(default_factory=dict)   # log file name -> its size when this attempt began
    lost: list[str] = field(default_factory=list)        # a recovery: the nodes whose loss began it

    @property
    def header(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.at))
        return f"=== attempt {self.number} ({self.why}) on {', '.join(self.nodes)}, started {when} ==="


@dataclass
class RunRecord:
    """The state of one run on one node (``run.json``), decoded with :func:`higgsfield.contract.codec.decode`:
    names checked as if typed (they become paths and terminal output on the control side), the error tail
    bounded (:func:`higgsfield.contract.decode.tail`)."""

    WHAT: ClassVar[str] = "record"

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
    error_tail: list[str] = field(default_factory=list, metadata=rule(decode=tail))  # that failure's last lines
    master_port: int | None = None     # the rendezvous port, chosen by node 0 when every node is admitted
    coord_port: int | None = None      # node 0: the port of the run's coordinator
    attempt: str | None = None         # the start that made this record (a failed start stops only its own)
    stall: Diagnosis | None = None        # the diagnosis at the run's (latest) stall, kept
    stalled_at: float | None = None       # when the coordinator found it stalled
    stragglers: list[Straggler] = field(default_factory=list)   # the ranks named stragglers now (node.gang.stragglers)
    attempts: list[Attempt] = field(default_factory=list)   # every start of this name here, oldest first
    lost: list[str] = field(default_factory=list)           # nodes this run lost and went on without
    spare: bool = False                                     # a spare standing by (until it takes a lost node's place)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def check(self) -> None:
        if not NAME_RE.fullmatch(self.project):
            raise DecodeError(f"'project' {shown(self.project)} is not a project name")
        if not is_run_name(self.run):
            raise DecodeError(f"'run' {shown(self.run)} is not a run name")
        check_node_name(self.node)
        if self.failed_node is not None:
            check_node_name(self.failed_node)
        for key in ("experiment", "runtime"):
            value = getattr(self, key)
            if not value or len(value) > 200 or has_control(value):
                raise DecodeError(f"'{key}' {shown(value)} is not a name")
        if self.state not in STATES:
            raise DecodeError(f"'state' {shown(self.state)} is not a run state")


class RecordError(DecodeError, RunError):
    """A run's record that does not decode; one line naming the file (``runs/p/x/run.json: not JSON ...``).

    A ValueError for the readers that skip it, a RunError for the CLI that prints it.
    """


class RunDir:
    """Paths of one run's directory, in the node's state directory ``home``."""

    def __init__(self, home: NodeState, project: str, run: str) -> None:
        self.home = home
        self.project, self.run = project, run
        self.path = home.root / layout.run_dir(project, run)

    @classmethod
    def of_path(cls, path: str | os.PathLike[str]) -> RunDir:
        """The RunDir of ``<state>/runs/<project>/<run>`` (a Slurm job is given its run's directory)."""
        p = Path(path)
        return cls(NodeState(p.parents[2]), p.parent.name, p.name)

    @property
    def rel(self) -> str:
        """The directory relative to the state dir (``runs/<project>/<run>``), as skip lines name it."""
        return layout.run_dir(self.project, self.run)

    @property
    def lock_file(self) -> Path:
        """``.lock``: flock'd while a start checks and records the run (a prune takes it too)."""
        return self.path / layout.LOCK

    @property
    def record_path(self) -> Path:
        return self.path / layout.RECORD

    @property
    def spec_path(self) -> Path:
        return self.path / layout.SPEC

    @property
    def logs(self) -> Path:
        return self.path / layout.LOGS

    def log_sizes(self) -> dict[str, int]:
        """Each log file's size now: where the output of an attempt that begins now will begin."""
        logs = self.logs
        return {p.name: p.stat().st_size for p in logs.glob("*.log") if p.is_file()} if logs.is_dir() else {}

    @property
    def launcher_log(self) -> Path:
        return self.logs / layout.LAUNCHER_LOG

    @property
    def kill_marker(self) -> Path:
        return self.path / layout.KILL

    @property
    def legacy_secrets_path(self) -> Path:
        """Where an older invoker's Docker runtime kept secrets; removed on sight."""
        return self.path / "secrets.json"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    def rank_error(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.error.json"

    def read(self) -> RunRecord:
        """The record, decoded (:class:`RunRecord`) from a file inside the state dir reached through
        no symlink; DecodeError when it does not decode or names another run than its directory."""
        try:
            record = decode(RunRecord, read_json(self.record_path, root=self.home.root))
        except DecodeError as e:
            raise RecordError(f"{one_line(self.rel, 300)}/run.json: {e}") from None
        if record.run != self.run or record.project != self.project:
            raise RecordError(f"{one_line(self.rel, 300)}/run.json: its run "
                              f"{shown(record.project + '/' + record.run)} is not its directory's")
        return record

    def write(self, record: RunRecord) -> None:
        write_json(self.record_path, encode(record))

    def make(self) -> None:
        """Create the run's directories, private to the node user (0700 up to the state dir)."""
        for d in (self.path.parent.parent, self.path.parent, self.path, self.logs):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            d.chmod(0o700)

    def exists(self) -> bool:
        """A record is there (a regular file, not a symlink, in a directory that is not one)."""
        try:
            return is_plain_dir(self.path) and stat.S_ISREG(os.lstat(self.record_path).st_mode)
        except OSError:
            return False


def finish(rd: RunDir, state: str, rc: int | None = None, fail: Failure | None = None) -> RunRecord:
    """Write the final record: ``state``, the exit code and, for a failed run, its first failure."""
    rd.legacy_secrets_path.unlink(missing_ok=True)  # left by an older invoker's docker runtime
    record = rd.read()
    record.ended_at = time.time()
    if rc is not None:
        record.exit_code = rc
    record.state = state
    if record.state == FAILED:
        fail = fail or Failure(record.node, None, time.time(), record.reason or f"torchrun exited {rc}")
        record.failed_node, record.failed_rank, record.failed_at = fail.node, fail.rank, fail.at
        record.reason = fail.reason or record.reason or "failed"
        record.error_tail = _tail_of(fail.tail)
    rd.write(record)
    return record


def stalled(rd: RunDir, diagnosis: Diagnosis, at: float, state: str | None = None) -> RunRecord:
    """Keep the run's stall (its diagnosis and when) in the record; ``state``: the run's new state, if any."""
    record = rd.read()
    record.stall, record.stalled_at = diagnosis, at
    if state is not None and not record.terminal:
        record.state = state
    rd.write(record)
    return record


def _tail_of(v: object) -> list[str]:
    """A failure's tail as the record keeps it: a list of lines, bounded (a string is one line)."""
    lines = [v] if isinstance(v, str) else list(v) if isinstance(v, (list, tuple)) else []
    return [cut(str(x)) for x in lines[-TAIL_LINES:]]


def list_runs(home: NodeState, project: str | None = None) -> list[RunDir]:
    """The run directories with a record (damaged ones left out: :func:`scan_runs` says which)."""
    return scan_runs(home, project)[0]


def scan_runs(home: NodeState, project: str | None = None, *,
              pending: bool = False) -> tuple[list[RunDir], list[str]]:
    """The run directories with a record (``pending``: and those without one yet), and one skip line
    for each entry that cannot be one.

    Skipped: a project or run directory whose name is not a valid name (it was not
    made by ``start``: a name with ``..`` or escape bytes), a symlinked directory or
    record (nothing outside the state dir is read). A directory without a record
    yet (a start in progress) is no run and no skip.
    """
    root = home.runs
    if not is_plain_dir(root):
        return [], []
    out: list[RunDir] = []
    skipped: list[str] = []
    for pname in _names(root) if project is None else [project]:
        pdir = root / pname
        if not is_plain_dir(pdir):
            if os.path.islink(pdir):
                skipped.append(skip_line(layout.runs_dir(pname), "a symlink (not followed)"))
            continue
        if not NAME_RE.fullmatch(pname):
            skipped.append(skip_line(layout.runs_dir(pname), "not a project name"))
            continue
        for rname in _names(pdir):
            rd = RunDir(home, pname, rname)
            why = _not_a_run(rd)
            if why is not None:
                skipped.append(skip_line(rd.rel, why))
            elif rd.exists() or (pending and is_plain_dir(rd.path) and not os.path.lexists(rd.record_path)):
                out.append(rd)
    return out, skipped


def _names(d: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(d))
    except OSError:
        return []


def _not_a_run(rd: RunDir) -> str | None:
    """Why ``rd`` cannot be a run's directory (None: it can, if it holds a record)."""
    try:
        st = os.lstat(rd.path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "a symlink (not followed)"
    if not stat.S_ISDIR(st.st_mode):
        return None          # a stray file: not a run, nothing to report
    if not is_run_name(rd.run):
        return "not a run name"
    try:
        if stat.S_ISLNK(os.lstat(rd.record_path).st_mode):
            return "run.json is a symlink (not followed)"
    except OSError:
        pass
    return None

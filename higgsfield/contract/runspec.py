"""The typed run contract between the control side, the nodes and every view of a run.

The objects that cross a process or machine boundary are typed, versioned and
stdlib-only (this module is neutral: the laptop, the node's invoker, the worker's
entrypoint, the dashboard and a second backend all import it, and it imports
nothing of theirs):

- :class:`RunSpec`: what the control side asks one node to run. It travels as JSON
  on SSH stdin (``{"spec": RunSpec.to_dict(), "secrets": {...}, "token": ...}``);
  secrets and the coordinator token are never part of it. A node reads it with
  :meth:`RunSpec.from_dict`, which refuses a spec of another ``version`` with one
  line saying which side to upgrade, and re-validates every name it will turn into
  a path (a node never trusts the wire to have been checked).
- :class:`NodeRunView` / :class:`NodeRuns`: what a node sends back of its runs
  (``invoker status``, the dashboard's feed), decoded once on the control side:
  typed records and the node's skip lines for files it could not decode
  (``NODE_RUNS_VERSION`` names the reply's schema).
- :class:`RunStatus`: one run across its nodes, as ``higgsfield status --json``
  prints it (``STATUS_VERSION`` names that schema) and the dashboard reads it.

One concept, the wire both ways, so one module (over 400 lines for that reason).

The run states are the words every layer uses; nothing spells them again.

Bump ``SPEC_VERSION`` for a change an older node cannot read (a field it must
understand); a new optional field with a default does not need it.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from higgsfield.contract.decode import DecodeError, from_fields, kind, tail
from higgsfield.contract.errors import RunError
from higgsfield.contract.names import MAX_NAME, NAME_RE, check_node_name, is_run_name
from higgsfield.contract.nodepart import NodePart, stall_of
from higgsfield.contract.stacks import Diagnosis
from higgsfield.contract.text import has_control, one_line, shown

SPEC_VERSION = 1
STATUS_VERSION = 1

# -- run states ---------------------------------------------------------------

QUEUED = "queued"          # waiting for its slots (or for every node to admit it)
STARTING = "starting"    # admitted, torchrun or its container coming up
RUNNING = "running"
STALLED = "stalled"        # running, but no rank progressed within the stall timeout (on_stall=wait)
SUCCEEDED = "succeeded"
FAILED = "failed"
KILLED = "killed"

STATES = (QUEUED, STARTING, RUNNING, STALLED, SUCCEEDED, FAILED, KILLED)
ACTIVE: frozenset[str] = frozenset({QUEUED, STARTING, RUNNING, STALLED})
TERMINAL: frozenset[str] = frozenset({SUCCEEDED, FAILED, KILLED})

RUNTIMES = ("auto", "docker", "process")
ON_STALL = ("fail", "restart", "wait")
"""What a run does when no rank progresses within ``stall_timeout``: fail it (the GPUs go to the next run),
restart its workers from the last checkpoint (counted against ``max_restarts``), or wait (state ``stalled``)."""


class SpecError(RunError):
    """A run spec this node cannot accept (another version, or a malformed field); says what to do."""

    exit_code = 2


# -- the spec -----------------------------------------------------------------

@dataclass(frozen=True)
class Coordinator:
    """Where the run's coordinator (on node 0) listens; every other node's supervisor reports to it."""

    host: str
    port: int
    node: str


@dataclass(frozen=True)
class RunSpec:
    """One node's part of a run, as the control side asks for it.

    ``node_rank`` orders the nodes (node 0 hosts the rendezvous and the coordinator,
    whose address node 0 does not need and the others get as ``coordinator``).
    ``nproc`` None means one process per GPU (or the node's CPU default).
    ``submitted_at`` is the FIFO order of every node's queue: the same on every node.
    """

    project: str
    experiment: str
    run: str
    module: str                      # the experiment's module under ``src_dir`` (``train`` for src/train.py)
    code_dir: str                    # the deployed project on the node (``~`` is the node user's home)
    params: dict[str, Any]           # resolved and validated by the control side, JSON values
    node: str
    node_rank: int
    nodes: tuple[str, ...]           # every node of the run, in node-rank order
    master_addr: str                 # node 0's address, as the other nodes reach it
    submitted_at: float
    nproc: int | None = None
    coordinator: Coordinator | None = None
    max_restarts: int = 0
    runtime: str = "auto"
    exclusive: bool = False
    src_dir: str = "src"
    attempt: str = ""
    """This start's random token (letters and digits): a failed start's clean-up stops only the records it made.
    Sent only when set, so a spec without one reads on a node that predates it."""
    checkpoint_mirror: str = ""
    """``checkpoint.mirror`` of higgsfield.yml (an fsspec URL, never a credential): the run's
    ``HIGGSFIELD_CHECKPOINT_MIRROR``. Sent only when set, like ``attempt``."""
    stall_timeout: float = 600.0
    """Seconds without progress of any rank (steps reported through ``higgsfield.training.progress``, else
    output lines) after which the run is stalled; 0: never. Sent only when not the default, like ``attempt``."""
    startup_timeout: float = 1800.0
    """Seconds the run may take to its first progress (imports, data loading, compilation); 0: unbounded."""
    on_stall: str = "fail"
    """One of :data:`ON_STALL`."""
    version: int = SPEC_VERSION

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    def replace(self, **changes: Any) -> RunSpec:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["nodes"] = list(self.nodes)
        if not self.attempt:
            del d["attempt"]
        if not self.checkpoint_mirror:
            del d["checkpoint_mirror"]
        for name, default in _STALL_DEFAULTS.items():   # an older node reads a default spec
            if d[name] == default:
                del d[name]
        return d

    @classmethod
    def from_dict(cls, data: object) -> RunSpec:
        """The spec in ``data`` (parsed JSON), checked field by field; :class:`SpecError` says what is wrong."""
        if not isinstance(data, dict):
            raise SpecError("the run spec is not a JSON object")
        version = data.get("version")
        if version != SPEC_VERSION:
            newer = isinstance(version, int) and not isinstance(version, bool) and version > SPEC_VERSION
            raise SpecError(
                f"run spec version {version!r} is not the version this node's higgsfield reads ({SPEC_VERSION}): "
                + ("the nodes are older than this higgsfield; upgrade them with 'higgsfield setup'" if newer
                   else "this higgsfield is older than the nodes'; upgrade it the way you installed it (README: Install), "
                        "then run 'higgsfield setup'"))
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"run spec field(s) {', '.join(map(repr, unknown[:5]))} unknown to this node's "
                            "higgsfield: upgrade the nodes with 'higgsfield setup'")
        try:
            spec = cls(
                project=_word(_str(data, "project"), "project"),
                experiment=_word(_str(data, "experiment"), "experiment"),
                run=_run_name(_str(data, "run")),
                module=_module(_str(data, "module")),
                code_dir=_str(data, "code_dir"),
                params=_dict(data, "params"),
                node=check_node_name(_str(data, "node")),
                node_rank=_int(data, "node_rank", lo=0),
                nodes=tuple(check_node_name(n) for n in _list(data, "nodes")),
                master_addr=_str(data, "master_addr"),
                submitted_at=_float(data, "submitted_at"),
                nproc=None if data.get("nproc") is None else _int(data, "nproc", lo=1),
                coordinator=_coordinator(data.get("coordinator")),
                max_restarts=_int(data, "max_restarts", lo=0, default=0),
                runtime=_choice(data, "runtime", RUNTIMES, default="auto"),
                exclusive=_bool(data, "exclusive", default=False),
                src_dir=_relative(_str(data, "src_dir", default="src")),
                attempt=_attempt(data.get("attempt")),
                checkpoint_mirror=_mirror_url(data.get("checkpoint_mirror")),
                stall_timeout=_seconds(data, "stall_timeout", default=600.0),
                startup_timeout=_seconds(data, "startup_timeout", default=1800.0),
                on_stall=_choice(data, "on_stall", ON_STALL, default="fail"),
            )
        except SpecError:
            raise
        except Exception as e:  # a name check's own error: say it is the spec's
            raise SpecError(f"run spec: {e}") from None
        if not spec.nodes or spec.node_rank >= len(spec.nodes) or spec.nodes[spec.node_rank] != spec.node:
            raise SpecError(f"run spec: node {spec.node!r} is not number {spec.node_rank} of its nodes")
        return spec


def _get(data: dict[str, Any], key: str, default: Any) -> Any:
    if key in data and data[key] is not None:
        return data[key]
    if default is _MISSING:
        raise SpecError(f"run spec: '{key}' is missing")
    return default


_MISSING = object()


def _str(data: dict[str, Any], key: str, default: Any = _MISSING) -> str:
    v = _get(data, key, default)
    if not isinstance(v, str) or not v or "\0" in v:
        raise SpecError(f"run spec: '{key}' must be a non-empty string")
    return v


def _int(data: dict[str, Any], key: str, *, lo: int, default: Any = _MISSING) -> int:
    v = _get(data, key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise SpecError(f"run spec: '{key}' must be an integer >= {lo}")
    return v


def _float(data: dict[str, Any], key: str) -> float:
    v = _get(data, key, _MISSING)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise SpecError(f"run spec: '{key}' must be a number")
    return float(v)


def _seconds(data: dict[str, Any], key: str, default: float) -> float:
    v = _get(data, key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise SpecError(f"run spec: '{key}' must be a number of seconds >= 0")
    return float(v)


def _bool(data: dict[str, Any], key: str, default: bool) -> bool:
    v = _get(data, key, default)
    if not isinstance(v, bool):
        raise SpecError(f"run spec: '{key}' must be true or false")
    return v


def _dict(data: dict[str, Any], key: str) -> dict[str, Any]:
    v = _get(data, key, {})
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise SpecError(f"run spec: '{key}' must be an object")
    return dict(v)


def _list(data: dict[str, Any], key: str) -> list[Any]:
    v = _get(data, key, _MISSING)
    if not isinstance(v, list):
        raise SpecError(f"run spec: '{key}' must be a list")
    return v


def _choice(data: dict[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
    v = _get(data, key, default)
    if v not in choices:
        raise SpecError(f"run spec: '{key}' must be one of {', '.join(choices)}")
    return str(v)


def _run_name(name: str) -> str:
    if not is_run_name(name):
        raise SpecError(f"run spec: {name[:100]!r} is not a run name")
    return name


def _attempt(v: object) -> str:
    if v is None or v == "":
        return ""
    if not isinstance(v, str) or len(v) > MAX_NAME or not (v.isascii() and v.isalnum()):
        raise SpecError("run spec: 'attempt' must be a token of at most 64 letters and digits")
    return v


def _mirror_url(v: object) -> str:
    """A URL that becomes an environment variable on the node: one line of text, bounded."""
    if v is None or v == "":
        return ""
    if not isinstance(v, str) or len(v) > 2000 or has_control(v):
        raise SpecError("run spec: 'checkpoint_mirror' must be a URL of one line")
    return v


def _word(name: str, key: str) -> str:
    """A project, experiment or module name: it becomes a path and a Python import on the node."""
    if not NAME_RE.fullmatch(name) or len(name) > MAX_NAME:
        raise SpecError(f"run spec: '{key}' {name[:100]!r} is not a name (letters, digits and _)")
    return name


def _module(name: str) -> str:
    for part in name.split("."):
        _word(part, "module")
    return name


def _relative(path: str) -> str:
    if path.startswith("/") or ".." in path.split("/"):
        raise SpecError(f"run spec: 'src_dir' must be a path inside the project, not {path[:100]!r}")
    return path


def _coordinator(v: object) -> Coordinator | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise SpecError("run spec: 'coordinator' must be an object")
    port = _int(v, "port", lo=1)
    if port > 65535:
        raise SpecError("run spec: 'coordinator.port' must be a TCP port")
    return Coordinator(host=_str(v, "host"), port=port, node=check_node_name(_str(v, "node")))


_STALL_DEFAULTS: dict[str, Any] = {"stall_timeout": 600.0, "startup_timeout": 1800.0, "on_stall": "fail"}


# -- one node's part of a run, as the node reports it ---------------------------

NODE_RUNS_VERSION = 1
"""The schema of ``invoker status``'s reply: ``{"version", "runs": [record], "skipped": [line]}``."""


@dataclass(frozen=True)
class NodeRunView:
    """One node's record of its part of a run, as ``invoker status`` (or the dashboard's feed) sends it.

    Decoded once, on the control side, from the node's JSON (:meth:`from_dict`: every
    field typed, names checked as if typed, the error tail bounded): the merge into a
    :class:`RunStatus` reads only these fields. The record's other keys (pids,
    command, ports...) travel in ``extra``, so :meth:`to_dict` gives the record back.
    """

    project: str
    experiment: str
    run: str
    node: str
    node_rank: int
    state: str
    created_at: float
    nnodes: int = 1
    nproc: int = 1
    runtime: str = "process"
    slots: list[int] = field(default_factory=list)
    exclusive: bool = False
    exit_code: int | None = None
    reason: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    failed_node: str | None = None
    failed_rank: int | None = None
    failed_at: float | None = None
    error_tail: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    stall: dict[str, Any] | None = None
    """The diagnosis at the run's latest stall (:class:`higgsfield.contract.stacks.Diagnosis` as a dict), or None."""
    stalled_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**self.extra, **d, "slots": list(self.slots), "error_tail": list(self.error_tail),
                "params": dict(self.params)}

    @classmethod
    def from_dict(cls, data: object) -> NodeRunView:
        """The view in ``data`` (one record of a node's reply); :class:`~higgsfield.contract.decode.DecodeError` names
        the field that is wrong."""
        view = from_fields(cls, data, special={"error_tail": tail, "extra": _no_extra, "stall": _diagnosis},
                           what="a run record")
        assert isinstance(data, dict)
        if not NAME_RE.fullmatch(view.project):
            raise DecodeError(f"'project' {shown(view.project)} is not a project name")
        if not is_run_name(view.run):
            raise DecodeError(f"'run' {shown(view.run)} is not a run name")
        if view.state not in STATES:
            raise DecodeError(f"'state' {shown(view.state)} is not a run state")
        for key in ("node", "failed_node"):
            try:
                if getattr(view, key) is not None:
                    check_node_name(getattr(view, key))
            except ValueError as e:
                raise DecodeError(f"'{key}': {e}") from None
        for key in ("experiment", "runtime", "reason"):
            value = getattr(view, key)
            if value is not None and (len(value) > 2000 or has_control(value)):
                raise DecodeError(f"'{key}' {shown(value)} holds a control character or is too long")
        known = {f.name for f in fields(cls)}
        return replace(view, extra={k: v for k, v in data.items() if k not in known})


def _diagnosis(v: object) -> dict[str, Any]:
    try:
        return Diagnosis.from_dict(v).to_dict()
    except DecodeError as e:
        raise TypeError(f"a stall diagnosis ({e})") from None


def _no_extra(v: object) -> dict[str, Any]:
    return {}   # ``extra`` is what ``from_dict`` leaves over, never a key of the record


@dataclass(frozen=True)
class NodeRuns:
    """A node's answer to ``invoker status``: its runs, and one line per file it skipped (damaged, a symlink,
    a directory that is no run's), each line naming the file and why."""

    runs: list[NodeRunView]
    skipped: list[str] = field(default_factory=list)

    @classmethod
    def from_reply(cls, data: object) -> NodeRuns:
        """The reply, decoded; a record that does not decode here is skipped with a line too. A bare list
        is an older node's reply (records only)."""
        records: object
        lines: object
        if isinstance(data, list):
            records, lines = data, []
        elif isinstance(data, dict):
            version = data.get("version")
            if version != NODE_RUNS_VERSION:
                raise DecodeError(f"a status reply of version {shown(version)} (this higgsfield reads "
                                  f"{NODE_RUNS_VERSION}): upgrade higgsfield here or on the node")
            records, lines = data.get("runs"), data.get("skipped") or []
            if not isinstance(records, list) or not isinstance(lines, list):
                raise DecodeError("the status reply's 'runs' and 'skipped' must be lists")
        else:
            raise DecodeError(f"the status reply is {kind(data)}, not an object")
        assert isinstance(records, list) and isinstance(lines, list)
        runs: list[NodeRunView] = []
        skipped = [one_line(str(x), 600) for x in lines[:1000]]
        for i, rec in enumerate(records):
            try:
                runs.append(NodeRunView.from_dict(rec))
            except DecodeError as e:
                name = rec.get("run") if isinstance(rec, dict) else None
                skipped.append(f"record {shown(name) if name is not None else i}: {e}")
        return cls(runs, skipped)


# -- one run across its nodes -------------------------------------------------

@dataclass
class RunStatus:
    """One run across its nodes: what ``status``, ``status --json`` and the dashboard show.

    ``nodes`` maps each node (in node-rank order) to its part of the run (:class:`NodePart`: state,
    slots, exit code, times, stall); a backend without per-node records (a scheduler) fills what it
    knows. ``failed_node`` and ``failed_rank`` name the run's first failure (``failed_rank`` None: the
    node's launcher itself failed), ``error_tail`` the last lines of its error.
    """

    project: str
    experiment: str
    run: str
    state: str
    nodes: dict[str, NodePart]
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    failed_node: str | None = None
    failed_rank: int | None = None
    reason: str | None = None
    error_tail: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    """The run's resolved params (what a re-run starts from); added to schema 1 (readers ignore new keys)."""
    stall: Diagnosis | None = None
    """The diagnosis of the run's latest stall (JSON: ``Diagnosis.to_dict()``); added to schema 1 like ``params``."""

    @property
    def duration(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at or time.time()) - self.started_at

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    def to_dict(self) -> dict[str, Any]:
        """The ``status --json`` schema (``version`` STATUS_VERSION)."""
        return {"version": STATUS_VERSION, "project": self.project, "experiment": self.experiment,
                "run": self.run, "state": self.state, "nodes": list(self.nodes), "created_at": self.created_at,
                "started_at": self.started_at, "ended_at": self.ended_at, "duration": self.duration,
                "exit_code": self.exit_code, "failed_node": self.failed_node, "failed_rank": self.failed_rank,
                "reason": self.reason, "error_tail": list(self.error_tail), "params": dict(self.params),
                "stall": None if self.stall is None else self.stall.to_dict(),
                "node_states": {n: p.state for n, p in self.nodes.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunStatus:
        """A status read back from ``to_dict``'s JSON (per-node parts keep only their state; a stall that
        does not decode is none)."""
        states = d.get("node_states") or {}
        return cls(project=d["project"], experiment=d["experiment"], run=d["run"], state=d["state"],
                   nodes={n: NodePart(state=states.get(n)) for n in d.get("nodes") or []},
                   created_at=float(d["created_at"]), started_at=d.get("started_at"), ended_at=d.get("ended_at"),
                   exit_code=d.get("exit_code"), failed_node=d.get("failed_node"),
                   failed_rank=d.get("failed_rank"), reason=d.get("reason"),
                   error_tail=list(d.get("error_tail") or []), params=dict(d.get("params") or {}),
                   stall=stall_of(d.get("stall")))

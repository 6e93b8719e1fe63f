"""What a node reports of its runs: :class:`NodeRunView` per record, :class:`NodeRuns` per ``invoker status``.

The node answers ``invoker status`` with a :class:`StatusReply` (``{"version", "runs":
[record], "skipped": [line]}``: its records as it wrote them, and one line per file it
could not decode). The control side reads it once with :func:`read_node_runs`, each
record decoded on its own into a :class:`NodeRunView` (every field typed, names checked,
the error tail bounded): a record that does not decode here is skipped with a line
too, so a damaged record hides only its own run. The dashboard's feed and the start
and kill replies carry the same views.

Use::

    runs = read_node_runs(json.loads(stdout))    # DecodeError: a reply of another version, or not one
    [v.run for v in runs.runs], runs.skipped
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from higgsfield.contract.codec import decode, rule
from higgsfield.contract.decode import DecodeError, tail
from higgsfield.contract.names import NAME_RE, check_node_name, is_run_name
from higgsfield.contract.stacks import Diagnosis
from higgsfield.contract.states import STATES
from higgsfield.contract.straggler import Straggler
from higgsfield.contract.text import has_control, one_line, shown

NODE_RUNS_VERSION = 1
"""The schema of ``invoker status``'s reply: ``{"version", "runs": [record], "skipped": [line]}``."""

MAX_SKIPPED = 1000      # skip lines a reply may bring (each cut to one line of SKIP_CHARS)
SKIP_CHARS = 600


def _project(v: str) -> None:
    if not NAME_RE.fullmatch(v):
        raise ValueError(f"{shown(v)} is not a project name")


def _run(v: str) -> None:
    if not is_run_name(v):
        raise ValueError(f"{shown(v)} is not a run name")


def _state(v: str) -> None:
    if v not in STATES:
        raise ValueError(f"{shown(v)} is not a run state")


def _shown_text(v: str) -> None:
    """Text a view shows (an experiment, a runtime, a reason): one line of it, bounded."""
    if len(v) > 2000 or has_control(v):
        raise ValueError(f"{shown(v)} holds a control character or is too long")


def _names(v: list[str]) -> None:
    for name in v:
        check_node_name(name)


@dataclass(frozen=True)
class AttemptView:
    """One start of a run's name, as a node's record keeps it: ``lost`` names the nodes whose loss began it
    (a recovery: the run went on on ``nodes``, from its last checkpoint)."""

    WHAT: ClassVar[str] = "attempt"

    number: int
    at: float
    nodes: list[str] = field(default_factory=list, metadata=rule(check=_names))
    why: str = field(default="", metadata=rule(check=_shown_text))
    lost: list[str] = field(default_factory=list, metadata=rule(check=_names))


@dataclass(frozen=True)
class NodeRunView:
    """One node's record of its part of a run, as ``invoker status`` (or the dashboard's feed) sends it.

    The merge into a :class:`~higgsfield.contract.runstatus.RunStatus` reads only these
    fields. The record's other keys (pids, command, ports...) travel in ``extra``
    (``UNKNOWN = "extra"``), so :func:`~higgsfield.contract.codec.encode` gives the record back.
    """

    WHAT: ClassVar[str] = "run record"
    UNKNOWN: ClassVar[str] = "extra"

    project: str = field(metadata=rule(check=_project))
    experiment: str = field(metadata=rule(check=_shown_text))
    run: str = field(metadata=rule(check=_run))
    node: str = field(metadata=rule(check=check_node_name))
    node_rank: int
    state: str = field(metadata=rule(check=_state))
    created_at: float
    nnodes: int = 1
    nproc: int = 1
    runtime: str = field(default="process", metadata=rule(check=_shown_text))
    slots: list[int] = field(default_factory=list)
    exclusive: bool = False
    exit_code: int | None = None
    reason: str | None = field(default=None, metadata=rule(check=_shown_text))
    started_at: float | None = None
    ended_at: float | None = None
    failed_node: str | None = field(default=None, metadata=rule(check=check_node_name))
    failed_rank: int | None = None
    failed_at: float | None = None
    error_tail: list[str] = field(default_factory=list, metadata=rule(decode=tail))
    params: dict[str, Any] = field(default_factory=dict)
    stall: Diagnosis | None = None
    """The diagnosis at the run's latest stall, or None."""
    stalled_at: float | None = None
    stragglers: list[Straggler] = field(default_factory=list)
    """The ranks the run's straggler rule names now (every node keeps the coordinator's finding)."""
    attempts: list[AttemptView] = field(default_factory=list)
    lost: list[str] = field(default_factory=list, metadata=rule(check=_names))
    """Nodes this run lost and went on without (their own records are left as the loss found them)."""
    spare: bool = False
    """A spare standing by: not one of the run's nodes (until it takes a lost node's place)."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


def _skip_lines(v: object) -> list[str]:
    if not isinstance(v, list):
        raise TypeError("a list of lines")
    return [one_line(str(x), SKIP_CHARS) for x in v[:MAX_SKIPPED]]


@dataclass(frozen=True)
class StatusReply:
    """``invoker status``'s reply as it travels: the node's records as it wrote them (each decoded on its own
    by :func:`read_node_runs`), and one line per file it skipped (damaged, a symlink, a directory that is no
    run's), each naming the file and why."""

    WHAT: ClassVar[str] = "status reply"
    VERSION: ClassVar[int] = NODE_RUNS_VERSION
    VERSION_DEFAULT: ClassVar[int | None] = None     # a bare list is an older node's (read_node_runs)

    runs: list[Any]
    skipped: list[str] = field(default_factory=list, metadata=rule(decode=_skip_lines))


@dataclass(frozen=True)
class NodeRuns:
    """A node's runs, decoded, and the skip lines: the node's, then one per record that did not decode here."""

    runs: list[NodeRunView]
    skipped: list[str] = field(default_factory=list)


def read_node_runs(data: object) -> NodeRuns:
    """``invoker status``'s reply (parsed JSON), decoded; a record that does not decode is skipped with a line.
    A bare list is an older node's reply (records only). DecodeError: not a status reply of this version."""
    reply = decode(StatusReply, {"version": NODE_RUNS_VERSION, "runs": data} if isinstance(data, list) else data)
    runs: list[NodeRunView] = []
    skipped = list(reply.skipped)
    for i, rec in enumerate(reply.runs):
        try:
            runs.append(decode(NodeRunView, rec))
        except DecodeError as e:
            name = rec.get("run") if isinstance(rec, dict) else None
            skipped.append(f"record {shown(name) if name is not None else i}: {e}")
    return NodeRuns(runs, skipped)

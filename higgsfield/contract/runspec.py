"""What the control side asks one node to run: :class:`RunSpec`, and :class:`StartRequest` that carries it.

Typed, versioned and stdlib-only: the laptop, the node's invoker, the worker's
entrypoint and a Slurm job all import it, and it imports nothing of theirs. Encoded
by :func:`~higgsfield.contract.codec.encode` and read by :func:`read_spec` (the codec's
:func:`~higgsfield.contract.codec.decode`, the version and unknown fields checked first
so that a spec of another version says which side to upgrade); every name the node
turns into a path or an import is checked by a field rule (a node never trusts the
wire to have been checked).

- :class:`StartRequest`: ``invoker start``'s stdin, ``{"spec", "secrets", "token", "notify"}``,
  encoded once on the laptop and read once on the node (:func:`read_request`); the
  secrets and the coordinator token are never part of the spec; the node hands them on to
  the run's supervisor as a :class:`Handoff` (its stdin).
- :class:`RunSpec`: one node's part of a run; the node pins it and writes it to
  ``RUN_DIR/spec.json`` (:mod:`higgsfield.node.state.placement`), where the worker reads it.

Bump ``SPEC_VERSION`` for a change an older node cannot read (a field it must
understand); a new optional field with a default does not need it (add it to
``SPARSE`` so that an older node still reads a spec that leaves it at its default).

Use::

    wire = json.dumps(encode(StartRequest(spec, secrets={"HF_TOKEN": "..."}, token=token)))
    request = read_request(json.loads(stdin))      # SpecError (exit 2): one line naming the field
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from higgsfield.contract.codec import decode, rule
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.errors import RunError
from higgsfield.contract.names import MAX_NAME, NAME_RE, check_node_name, is_run_name
from higgsfield.contract.notify import Notify
from higgsfield.contract.stall_policy import DEFAULT_STALL, ON_STALL_CHOICES
from higgsfield.contract.straggler import ON_STRAGGLER_CHOICES
from higgsfield.contract.text import has_control

SPEC_VERSION = 1

RUNTIMES = ("auto", "docker", "process")
DEFAULT_MAX_RECOVERIES = 3   # lost nodes a run goes on after (with min_nodes below its nodes)
ON_STALL = ON_STALL_CHOICES   # higgsfield.contract.stall_policy.OnStall's values
"""What a run does when no rank progresses within ``stall_timeout``: fail it (the GPUs go to the next run),
restart its workers from the last checkpoint (counted against ``max_restarts``), or wait (state ``stalled``)."""


class SpecError(RunError):
    """A run spec this node cannot accept (another version, or a malformed field); says what to do."""

    exit_code = 2


# -- the field rules: each raises ValueError with the reason (the codec names the field) --------------

def _text(v: str) -> None:
    if not v or "\0" in v:
        raise ValueError("must be a non-empty string")


def _name(v: str) -> None:
    """A project, experiment or module name: it becomes a path and a Python import on the node."""
    _text(v)
    if not NAME_RE.fullmatch(v) or len(v) > MAX_NAME:
        raise ValueError(f"{v[:100]!r} is not a name (letters, digits and _)")


def _module(v: str) -> None:
    for part in v.split("."):
        _name(part)


def _run(v: str) -> None:
    if not is_run_name(v):
        raise ValueError(f"{v[:100]!r} is not a run name")


def _nodes(v: tuple[str, ...]) -> None:
    for n in v:
        check_node_name(n)


def _at_least(lo: int) -> Callable[[int], None]:
    def check(v: int) -> None:
        if v < lo:
            raise ValueError(f"must be an integer >= {lo}")
    return check


def _one_of(choices: tuple[str, ...]) -> Callable[[str], None]:
    def check(v: str) -> None:
        if v not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
    return check


def _inside(v: str) -> None:
    _text(v)
    if v.startswith("/") or ".." in v.split("/"):
        raise ValueError(f"must be a path inside the project, not {v[:100]!r}")


def _token(v: str) -> None:
    if v and (len(v) > MAX_NAME or not (v.isascii() and v.isalnum())):
        raise ValueError(f"must be a token of at most {MAX_NAME} letters and digits")


def _url(v: str) -> None:
    """A URL that becomes an environment variable on the node: one line of text, bounded."""
    if len(v) > 2000 or has_control(v):
        raise ValueError("must be a URL of one line")


def _seconds(v: float) -> None:
    if v < 0:
        raise ValueError("must be a number of seconds >= 0")


def _port(v: int) -> None:
    if not 0 < v < 65536:
        raise ValueError("must be a TCP port")


# -- the spec -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Coordinator:
    """Where the run's coordinator (on node 0) listens; every other node's supervisor reports to it."""

    host: str = field(metadata=rule(check=_text))
    port: int = field(metadata=rule(check=_port))
    node: str = field(metadata=rule(check=check_node_name))


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """One node's part of a run, as the control side asks for it.

    ``node_rank`` orders the nodes (node 0 hosts the rendezvous and the coordinator,
    whose address node 0 does not need and the others get as ``coordinator``).
    ``nproc`` None means one process per GPU (or the node's CPU default).
    ``submitted_at`` is the FIFO order of every node's queue: the same on every node.
    Built by keyword only (its fields keep the order of the JSON the nodes always read).
    """

    WHAT: ClassVar[str] = "run spec"
    VERSION: ClassVar[int] = SPEC_VERSION
    VERSION_DEFAULT: ClassVar[int | None] = None     # a spec always says its version
    UNKNOWN: ClassVar[str] = "refuse"                # a node must understand a spec whole
    SPARSE: ClassVar[frozenset[str]] = frozenset({
        "attempt", "checkpoint_mirror", "stall_timeout", "startup_timeout", "on_stall", "min_nodes",
        "max_recoveries", "spares", "addresses", "on_straggler"})
    """Sent only when not at their default, so a spec without them reads on a node that predates them."""

    project: str = field(metadata=rule(check=_name))
    experiment: str = field(metadata=rule(check=_name))
    run: str = field(metadata=rule(check=_run))
    module: str = field(metadata=rule(check=_module))
    """The experiment's module under ``src_dir`` (``train`` for src/train.py)."""
    code_dir: str = field(metadata=rule(check=_text))
    """The deployed project on the node (``~`` is the node user's home)."""
    params: dict[str, Any] = field(default_factory=dict)
    """Resolved and validated by the control side, JSON values."""
    node: str = field(metadata=rule(check=check_node_name))
    node_rank: int = field(metadata=rule(check=_at_least(0)))
    nodes: tuple[str, ...] = field(metadata=rule(check=_nodes))
    """Every node of the run, in node-rank order."""
    master_addr: str = field(metadata=rule(check=_text))
    """Node 0's address, as the other nodes reach it."""
    submitted_at: float
    nproc: int | None = field(default=None, metadata=rule(check=_at_least(1)))
    coordinator: Coordinator | None = None
    max_restarts: int = field(default=0, metadata=rule(check=_at_least(0)))
    runtime: str = field(default="auto", metadata=rule(check=_one_of(RUNTIMES)))
    exclusive: bool = False
    src_dir: str = field(default="src", metadata=rule(check=_inside))
    attempt: str = field(default="", metadata=rule(check=_token))
    """This start's random token (letters and digits): a failed start's clean-up stops only the records it made."""
    checkpoint_mirror: str = field(default="", metadata=rule(check=_url))
    """``checkpoint.mirror`` of higgsfield.yml (an fsspec URL, never a credential): the run's
    ``HIGGSFIELD_CHECKPOINT_MIRROR``."""
    stall_timeout: float = field(default=DEFAULT_STALL.stall_timeout, metadata=rule(check=_seconds))
    """Seconds without progress of any rank (steps reported through ``higgsfield.training.progress``, else
    output lines) after which the run is stalled; 0: never."""
    startup_timeout: float = field(default=DEFAULT_STALL.startup_timeout, metadata=rule(check=_seconds))
    """Seconds the run may take to its first progress (imports, data loading, compilation); 0: unbounded."""
    on_stall: str = field(default=DEFAULT_STALL.on_stall.value, metadata=rule(check=_one_of(ON_STALL)))
    """One of :data:`ON_STALL`."""
    min_nodes: int = field(default=0, metadata=rule(check=_at_least(0)))
    """The fewest nodes the run may go on on after losing some (0: all of them, no recovery by shrinking)."""
    max_recoveries: int = field(default=DEFAULT_MAX_RECOVERIES, metadata=rule(check=_at_least(0)))
    """How many lost nodes the run recovers from before it fails (0: none)."""

    spares: tuple[str, ...] = field(default=(), metadata=rule(check=_nodes))
    """The run's spare nodes, in order: each holds its slots and stands by, and one takes a lost node's place.
    A spare's own spec has ``node_rank`` ``len(nodes) + i`` (its rank as a member of the run's gang)."""
    addresses: dict[str, str] = field(default_factory=dict)
    """Every member's address as the others reach it (node 0's is ``master_addr``), sent with a run that
    recovers: should node 0 be lost, the next node hosts the coordinator and the rendezvous there."""
    on_straggler: str = field(default="warn", metadata=rule(check=_one_of(ON_STRAGGLER_CHOICES)))
    """``on_straggler`` of higgsfield.yml (:class:`~higgsfield.contract.straggler.OnStraggler`): ``replace`` puts a
    straggler's node out of the run when a spare stands by."""

    @property
    def recovers(self) -> bool:
        """Can this run go on after losing a node?"""
        return self.max_recoveries > 0 and (bool(self.spares) or 0 < self.min_nodes < len(self.nodes))

    @property
    def spare(self) -> bool:
        """Is this node one of the run's spares (standing by, not one of its nodes)?"""
        return self.node_rank >= len(self.nodes)

    @property
    def members(self) -> tuple[str, ...]:
        """Everyone in the run's gang: its nodes, then its spares."""
        return self.nodes + self.spares

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    def replace(self, **changes: Any) -> RunSpec:
        return replace(self, **changes)

    def check(self) -> None:
        if not self.nodes or self.node_rank >= len(self.members) or self.members[self.node_rank] != self.node:
            raise ValueError(f"node {self.node!r} is not number {self.node_rank} of its nodes and spares")


SPEC_KEYS = frozenset(f.name for f in fields(RunSpec)) | {"version"}
"""The keys of a spec's JSON: what a file holding a spec beside other keys (``spec.json``) gives :func:`read_spec`."""


def read_spec(data: object) -> RunSpec:
    """The spec in ``data`` (parsed JSON), every field checked; :class:`SpecError` says what is wrong.

    Its version first (another one says which side to upgrade), then its keys (one this
    node does not know means a newer control side), then :func:`~higgsfield.contract.codec.decode`.
    """
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
    unknown = sorted(set(data) - SPEC_KEYS)
    if unknown:
        raise SpecError(f"run spec field(s) {', '.join(map(repr, unknown[:5]))} unknown to this node's "
                        "higgsfield: upgrade the nodes with 'higgsfield setup'")
    try:
        return decode(RunSpec, data)
    except DecodeError as e:
        raise SpecError(f"run spec: {e}") from None


# -- the start request -------------------------------------------------------------------------------

@dataclass(frozen=True)
class StartRequest:
    """``invoker start``'s stdin: the spec, the run's secrets (its environment) and the coordinator's token.

    Secrets travel only here (SSH stdin), never on a command line, in a file or a log;
    the node hands them and the token to the run's supervisor on its stdin.
    """

    WHAT: ClassVar[str] = "run request"

    spec: RunSpec = field(metadata=rule(decode=read_spec))
    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    token: str = field(default="", repr=False)
    """Authenticates the run's nodes to its coordinator (random per start)."""
    notify: Notify = field(default_factory=Notify, repr=False, metadata=rule(sparse=True))
    """Where node 0 sends the run's events (:mod:`higgsfield.contract.notify`: the URLs are secrets)."""

    @property
    def handoff(self) -> Handoff:
        """What the node hands the run's supervisor: this request less its spec."""
        return Handoff(self.secrets, self.token, self.notify)


@dataclass(frozen=True)
class Handoff:
    """The run's supervisor's stdin (``invoker supervise``): the start request's secrets and token, written by
    the node that started it (:func:`~higgsfield.contract.codec.encode`) and decoded once by the supervisor."""

    WHAT: ClassVar[str] = "supervisor's handoff"

    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    token: str = field(default="", repr=False)
    notify: Notify = field(default_factory=Notify, repr=False, metadata=rule(sparse=True))


def read_request(data: object) -> StartRequest:
    """The start request on ``invoker start``'s stdin (parsed JSON); :class:`SpecError` (exit 2) says what is
    wrong (the spec's own errors are :func:`read_spec`'s)."""
    if not isinstance(data, dict):
        raise SpecError("the run request on stdin is not a JSON object")
    try:
        return decode(StartRequest, data)
    except DecodeError as e:
        raise SpecError(f"the run request: {e}") from None

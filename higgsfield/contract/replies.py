"""The replies of the invoker's verbs: typed, versioned, decoded once at the seam.

Every verb of ``higgsfield invoker`` that the control side reads prints one JSON
object (``env`` one per line): the node function returns one of these dataclasses,
the node's CLI prints :func:`~higgsfield.contract.codec.encode` of it, and the control
side reads it back with :func:`~higgsfield.contract.codec.decode` (every field typed,
strings and lists bounded by :meth:`Typed.check`) and reads attributes, never keys. A
reply that does not decode is a :class:`~higgsfield.contract.decode.DecodeError` of one
line naming the field; a reply of another ``version`` is one too (the caller adds
which node and ``higgsfield setup``). A reply without ``version`` is an older node's:
it reads as version 1, the shape these types had before they were versioned.

The wire is the shape the verbs printed before, plus ``version`` (``reply_version``
for ``invoker version``, whose ``version`` was always the package's): keys a type
does not name travel in ``extra`` (``UNKNOWN = "extra"``), and the fields in ``SPARSE``
are left out at their default, as the node always left them out.

- :class:`VersionReply` (``version``), :class:`Deployment` (``deployed``, null when
  nothing is; ``deploy``), :class:`BuildReply` (``build``), :class:`EnvReply` /
  :class:`EnvLine` (``env --check`` / ``env``'s lines);
- :class:`StartReply` (the node's record of the run, a
  :class:`~higgsfield.contract.noderuns.NodeRunView`), :class:`NameInUseReply` (``start``),
  :class:`KillReply` (``kill --run``, ``kill --attempt``), :class:`KillTargetReply` (``kill --target``);
- :class:`StacksReply` (``stacks``): a run's ranks' stacks on the node, taken now or at its stall;
- :class:`FilesReply` (``files``), :class:`PruneReply` (``prune``), :class:`UsageReply`
  (``usage``): in :mod:`higgsfield.contract.replies_disk`.

``status`` answers :class:`~higgsfield.contract.noderuns.StatusReply`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from higgsfield.contract.codec import decode, rule
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.names import is_run_name
from higgsfield.contract.noderuns import NodeRunView
from higgsfield.contract.stacks import RankStacks
from higgsfield.contract.states import STATES
from higgsfield.contract.text import shown

REPLY_VERSION = 1
"""The schema of every reply below (each class's ``VERSION``); bump one for a change an older
control side cannot read (a field it must understand). A new optional field does not need it."""

MAX_TEXT = 8192         # a path, a tag, a line: far below this
MAX_ITEMS = 200_000     # the files of one checkpoint step, the runs of a prune


class Typed:
    """A frozen dataclass that crosses the wire, by the codec; every string and list in it bounded."""

    WHAT: ClassVar[str] = "reply"
    SPARSE: ClassVar[frozenset[str]] = frozenset()
    """Fields left out of the encoding while at their default (the node never sent them then)."""
    UNKNOWN: ClassVar[str] = "extra"
    """A key the type does not name travels in its ``extra`` (where it has one; else it is ignored)."""

    def check(self) -> None:
        """No string over ``MAX_TEXT`` characters, no list over ``MAX_ITEMS`` items; a subclass adds its own
        checks (names, states) after calling this one."""
        for f in fields(self):  # type: ignore[arg-type]
            if f.name != "extra":
                _bound(f.name, getattr(self, f.name))


class Reply(Typed):
    """A whole reply: :class:`Typed`, with its schema's ``version`` on the wire (none: an older node's, 1)."""

    VERSION: ClassVar[int] = REPLY_VERSION
    VERSION_KEY: ClassVar[str] = "version"
    VERSION_DEFAULT: ClassVar[int | None] = REPLY_VERSION


def _bound(name: str, v: object) -> None:
    if isinstance(v, str) and len(v) > MAX_TEXT:
        raise DecodeError(f"'{name}' is too long ({len(v)} characters; at most {MAX_TEXT})")
    if isinstance(v, (list, tuple)):
        if len(v) > MAX_ITEMS:
            raise DecodeError(f"'{name}' has too many items ({len(v)}; at most {MAX_ITEMS})")
        for x in v:
            if isinstance(x, str) and len(x) > MAX_TEXT:
                raise DecodeError(f"'{name}' holds an item too long ({len(x)} characters; at most {MAX_TEXT})")


# -- the field rules (ValueError: the codec names the field) ---------------------------------------

def not_negative(v: float) -> None:
    if v < 0:
        raise ValueError(f"must not be negative, not {v}")


def run_name(v: str) -> None:
    if not is_run_name(v):
        raise ValueError(f"{shown(v)} is not a run name")


def run_state(v: str) -> None:
    if v not in STATES:
        raise ValueError(f"{shown(v)} is not a run state")


def tcp_port(v: int) -> None:
    if not 0 < v < 65536:
        raise ValueError(f"{v} is not a TCP port")


# -- version, deploy, build, env ---------------------------------------------------------------

@dataclass(frozen=True)
class VersionReply(Reply):
    """``invoker version``: the node's higgsfield and its Python (``version`` is the package's; the reply's
    own schema is ``reply_version``)."""

    WHAT: ClassVar[str] = "version reply"
    VERSION_KEY: ClassVar[str] = "reply_version"

    version: str
    python: str = ""


@dataclass(frozen=True)
class Deployment(Reply):
    """``invoker deployed`` (null: nothing deployed) and ``invoker deploy``: the release the node verified."""

    WHAT: ClassVar[str] = "deploy reply"

    commit: str
    dirty: bool = False
    release: str | None = None
    deployed_at: float | None = None
    code_dir: str | None = None
    image: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class BuildReply(Reply):
    """``invoker build``: the image's tag and whether it was built, or why there is none (``skipped``)."""

    WHAT: ClassVar[str] = "build reply"
    SPARSE: ClassVar[frozenset[str]] = frozenset({"tag", "built", "seconds", "skipped"})

    tag: str | None = None
    built: bool | None = None
    seconds: float | None = None
    skipped: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


ENV_STATES = ("present", "stale", "missing")


def _env_state(v: str) -> None:
    if v not in ENV_STATES:
        raise ValueError(f"{shown(v)} is not one of {', '.join(ENV_STATES)}")


@dataclass(frozen=True)
class EnvReply(Reply):
    """The project environment (``runtime: process``): ``env --check``'s state (present, stale, missing,
    what it wants), or the result of ``env``'s build (``built``, ``pruned``); both carry its record."""

    WHAT: ClassVar[str] = "env reply"
    SPARSE: ClassVar[frozenset[str]] = frozenset({
        "state", "project", "wanted", "key", "dir", "python", "torch", "torch_added", "built_at", "seconds",
        "built", "pruned"})

    state: str | None = field(default=None, metadata=rule(check=_env_state))
    project: str | None = None
    wanted: str | None = None
    key: str | None = None
    dir: str | None = None
    python: str | None = None
    torch: str | None = None
    torch_added: str | None = None
    built_at: float | None = None
    seconds: float | None = None
    built: bool | None = None
    pruned: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


def _env_reply(v: object) -> EnvReply:
    return decode(EnvReply, v)     # a whole reply of its own: its version checked too


@dataclass(frozen=True)
class EnvLine(Reply):
    """One line of ``invoker env`` (a build): a progress message, or the result."""

    WHAT: ClassVar[str] = "env line"
    SPARSE: ClassVar[frozenset[str]] = frozenset({"progress", "result"})

    progress: str | None = None
    result: EnvReply | None = field(default=None, metadata=rule(decode=_env_reply))


# -- start, kill ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class StartReply(NodeRunView, Reply):
    """``invoker start``: the node's record of its part of the run (node 0's names its coordinator's port).

    A :class:`~higgsfield.contract.noderuns.NodeRunView` (the run handle keeps it as
    such: decoded once), plus ``coord_port``; the record's other keys travel in ``extra``.
    ``params`` is not part of the record (``invoker status`` adds it): left out at its default."""

    WHAT: ClassVar[str] = "start reply"
    SPARSE: ClassVar[frozenset[str]] = frozenset({"params"})

    coord_port: int | None = field(default=None, metadata=rule(check=tcp_port))


@dataclass(frozen=True)
class NameInUseReply(Reply):
    """``invoker start``'s refusal (exit 2) of a name an active run holds: this start made nothing there."""

    WHAT: ClassVar[str] = "name-in-use reply"

    name_in_use: bool
    run: str = field(metadata=rule(check=run_name))
    state: str
    node: str

    def check(self) -> None:
        super().check()
        if self.name_in_use is not True:
            raise DecodeError("'name_in_use' is not true")


@dataclass(frozen=True)
class KillReply(Reply):
    """``invoker kill --run`` (``--missing-ok``, ``--attempt``): the run's final record on the node, or
    ``missing`` (no such run there, or not this attempt's)."""

    WHAT: ClassVar[str] = "kill reply"
    SPARSE: ClassVar[frozenset[str]] = frozenset({"missing", "state"})

    run: str = field(metadata=rule(check=run_name))
    missing: bool = False
    state: str | None = field(default=None, metadata=rule(check=run_state))
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


def _views(v: object) -> list[NodeRunView]:
    """The killed records, each decoded; one that does not decode is left out (``invoker status`` names it)."""
    if not isinstance(v, list):
        raise TypeError("a list of run records")
    if len(v) > MAX_ITEMS:
        raise DecodeError(f"too many run records ({len(v)}; at most {MAX_ITEMS})")
    out = []
    for rec in v:
        try:
            out.append(decode(NodeRunView, rec))
        except DecodeError:
            continue
    return out


@dataclass(frozen=True)
class KillTargetReply(Reply):
    """``invoker kill --target``: how many of the project's runs the target matched, and the final records
    of those it stopped."""

    WHAT: ClassVar[str] = "kill reply"

    matched: int = field(metadata=rule(check=not_negative))
    killed: list[NodeRunView] = field(default_factory=list, metadata=rule(decode=_views))


# -- stacks ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StacksReply(Reply):
    """``invoker stacks``: the Python stacks of a run's ranks on the node (:mod:`higgsfield.contract.stacks`).

    Taken now while the run is active there, else those saved at its stall (``saved``); none
    when it ended without stalling. ``state`` is the run's state on the node."""

    WHAT: ClassVar[str] = "stacks reply"

    run: str = field(metadata=rule(check=run_name))
    state: str = field(metadata=rule(check=run_state))
    ranks: list[RankStacks] = field(default_factory=list)
    saved: bool = False

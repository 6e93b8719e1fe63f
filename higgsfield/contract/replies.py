"""The replies of the invoker's verbs: typed, versioned, decoded once at the seam.

Every verb of ``higgsfield invoker`` that the control side reads prints one JSON
object (``env`` one per line); the node builds it as one of these dataclasses and
prints :meth:`to_dict`, the control side turns the parsed JSON back into it with
:meth:`from_dict` (through :func:`higgsfield.contract.decode.from_fields`: every field
typed, lists and strings bounded) and reads attributes, never keys. A reply that
does not decode is a :class:`~higgsfield.contract.decode.DecodeError` of one line
naming the field; a reply of another ``version`` is one too (the caller adds which
node and ``higgsfield setup``). A reply without ``version`` is an older node's:
it reads as version 1, the shape these types had before they were versioned.

The wire is the shape the verbs printed before, plus ``version`` (``reply_version``
for ``invoker version``, whose ``version`` was always the package's): keys a type
does not name travel in ``extra`` and come back out of :meth:`to_dict`, and the
fields in ``SPARSE`` are left out at their default, as the node always left them out.

- :class:`VersionReply` (``version``), :class:`Deployment` (``deployed``, null when
  nothing is; ``deploy``), :class:`BuildReply` (``build``), :class:`EnvReply` /
  :class:`EnvLine` (``env --check`` / ``env``'s lines);
- :class:`StartReply`, :class:`NameInUseReply` (``start``), :class:`KillReply`
  (``kill --run``, ``kill --attempt``), :class:`KillTargetReply` (``kill --target``);
- :class:`StacksReply` (``stacks``): a run's ranks' stacks on the node, taken now or at its stall;
- :class:`FilesReply` (``files``), :class:`PruneReply` (``prune``), :class:`UsageReply`
  (``usage``): in :mod:`higgsfield.contract.replies_disk`.

``status`` answers :class:`~higgsfield.contract.runspec.NodeRuns`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import Any, ClassVar, TypeVar

from higgsfield.contract.decode import DecodeError, from_fields, kind
from higgsfield.contract.names import is_run_name
from higgsfield.contract.runspec import STATES, NodeRunView
from higgsfield.contract.stacks import RankStacks
from higgsfield.contract.text import shown

REPLY_VERSION = 1
"""The schema of every reply below (each class's ``VERSION``); bump one for a change an older
control side cannot read (a field it must understand). A new optional field does not need it."""

MAX_TEXT = 8192         # a path, a tag, a line: far below this
MAX_ITEMS = 200_000     # the files of one checkpoint step, the runs of a prune

E = TypeVar("E", bound="Typed")


class Typed:
    """A frozen dataclass that crosses the wire: :meth:`to_dict` and a defensive :meth:`from_dict`."""

    WHAT: ClassVar[str] = "reply"
    SPARSE: ClassVar[frozenset[str]] = frozenset()
    """Fields left out of :meth:`to_dict` while at their default (the node never sent them then)."""

    @classmethod
    def decoders(cls) -> Mapping[str, Callable[[object], Any]]:
        """Each field's own decoder where its annotation is not one ``from_fields`` knows (nested types)."""
        return {}

    def check(self) -> None:
        """The checks beyond the types (names, states, ranges); DecodeError in one line."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(getattr(self, "extra", None) or {})
        for f in fields(self):  # type: ignore[arg-type]
            if f.name == "extra":
                continue
            v = getattr(self, f.name)
            if f.name in self.SPARSE and v == _default(f):
                continue
            out[f.name] = _plain(v)
        return out

    @classmethod
    def from_dict(cls: type[E], data: object) -> E:
        return cls._decode(data)

    @classmethod
    def _decode(cls: type[E], data: object, *, drop: frozenset[str] = frozenset()) -> E:
        if not isinstance(data, dict):
            raise DecodeError(f"the {cls.WHAT} is {kind(data)}, not an object")
        own = [f for f in fields(cls) if f.init and f.name != "extra"]  # type: ignore[arg-type]
        missing = [f.name for f in own if data.get(f.name) is None and _default(f) is MISSING]
        if missing:
            raise DecodeError(f"no {', '.join(missing)} in the {cls.WHAT}")
        special = {"extra": _no_extra, **cls.decoders()}
        obj = from_fields(cls, data, special=special, what=f"the {cls.WHAT}")
        for f in own:
            _bound(f.name, getattr(obj, f.name))
        obj.check()
        if any(f.name == "extra" for f in fields(cls)):  # type: ignore[arg-type]
            known = {f.name for f in own} | drop
            obj = replace(obj, extra={k: v for k, v in data.items() if k not in known})  # type: ignore[type-var]
        return obj


class Reply(Typed):
    """A whole reply: :class:`Typed`, with its schema's ``version`` on the wire."""

    VERSION: ClassVar[int] = REPLY_VERSION
    VERSION_KEY: ClassVar[str] = "version"

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), self.VERSION_KEY: self.VERSION}

    @classmethod
    def from_dict(cls: type[E], data: object) -> E:
        assert issubclass(cls, Reply)
        if isinstance(data, dict):
            version = data.get(cls.VERSION_KEY, REPLY_VERSION)   # none: an older node's, version 1
            if version != cls.VERSION:
                raise DecodeError(f"the {cls.WHAT} is of version {shown(version)} (this higgsfield reads "
                                  f"{cls.VERSION}): upgrade higgsfield here or on the node")
        return cls._decode(data, drop=frozenset({cls.VERSION_KEY}))


def _default(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def _plain(v: Any) -> Any:
    if isinstance(v, (Typed, NodeRunView, RankStacks)):
        return v.to_dict()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return dict(v)
    return v


def _no_extra(v: object) -> dict[str, Any]:
    return {}   # ``extra`` is what ``from_dict`` leaves over, never a key of the reply


def _bound(name: str, v: object) -> None:
    if isinstance(v, str) and len(v) > MAX_TEXT:
        raise DecodeError(f"'{name}' is too long ({len(v)} characters; at most {MAX_TEXT})")
    if isinstance(v, list):
        if len(v) > MAX_ITEMS:
            raise DecodeError(f"'{name}' has too many items ({len(v)}; at most {MAX_ITEMS})")
        for x in v:
            if isinstance(x, str) and len(x) > MAX_TEXT:
                raise DecodeError(f"'{name}' holds an item too long ({len(x)} characters; at most {MAX_TEXT})")


def each(cls: type[E], what: str) -> Callable[[object], list[E]]:
    """A decoder of a list of ``cls`` (at most ``MAX_ITEMS``); DecodeError names the item."""
    plural = what[:-1] + "ies" if what.endswith("y") else what + "s"

    def check(v: object) -> list[E]:
        if not isinstance(v, list):
            raise TypeError(f"a list of {plural}")
        if len(v) > MAX_ITEMS:
            raise DecodeError(f"too many {plural} ({len(v)}; at most {MAX_ITEMS})")
        out = []
        for i, x in enumerate(v):
            try:
                out.append(cls.from_dict(x))
            except DecodeError as e:
                raise DecodeError(f"{what} {i}: {e}") from None
        return out
    return check


def nonnegative(obj: object, *names: str) -> None:
    for name in names:
        v = getattr(obj, name)
        if v is not None and v < 0:
            raise DecodeError(f"'{name}' must not be negative, not {v}")


def run_name(v: str, key: str = "run") -> None:
    if not is_run_name(v):
        raise DecodeError(f"'{key}' {shown(v)} is not a run name")


def run_state(v: str | None) -> None:
    if v is not None and v not in STATES:
        raise DecodeError(f"'state' {shown(v)} is not a run state")


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


@dataclass(frozen=True)
class EnvReply(Reply):
    """The project environment (``runtime: process``): ``env --check``'s state (present, stale, missing,
    what it wants), or the result of ``env``'s build (``built``, ``pruned``); both carry its record."""

    WHAT: ClassVar[str] = "env reply"
    SPARSE: ClassVar[frozenset[str]] = frozenset({
        "state", "project", "wanted", "key", "dir", "python", "torch", "torch_added", "built_at", "seconds",
        "built", "pruned"})

    state: str | None = None
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

    def check(self) -> None:
        if self.state is not None and self.state not in ENV_STATES:
            raise DecodeError(f"'state' {shown(self.state)} is not one of {', '.join(ENV_STATES)}")


@dataclass(frozen=True)
class EnvLine(Reply):
    """One line of ``invoker env`` (a build): a progress message, or the result."""

    WHAT: ClassVar[str] = "env line"
    SPARSE: ClassVar[frozenset[str]] = frozenset({"progress", "result"})

    progress: str | None = None
    result: EnvReply | None = None

    @classmethod
    def decoders(cls) -> Mapping[str, Callable[[object], Any]]:
        return {"result": EnvReply.from_dict}


# -- start, kill ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class StartReply(Reply):
    """``invoker start``: the node's record of its part of the run (node 0's names its coordinator's port).

    The control side reads ``state``, ``run`` and ``coord_port``; the record's other keys travel in
    ``extra`` and :meth:`record` gives the whole record back (a run handle keeps it)."""

    WHAT: ClassVar[str] = "start reply"

    state: str
    run: str
    coord_port: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def check(self) -> None:
        run_state(self.state)
        run_name(self.run)
        if self.coord_port is not None and not 0 < self.coord_port < 65536:
            raise DecodeError(f"'coord_port' {self.coord_port} is not a TCP port")

    def record(self) -> dict[str, Any]:
        d = self.to_dict()
        del d[self.VERSION_KEY]
        return d


@dataclass(frozen=True)
class NameInUseReply(Reply):
    """``invoker start``'s refusal (exit 2) of a name an active run holds: this start made nothing there."""

    WHAT: ClassVar[str] = "name-in-use reply"

    name_in_use: bool
    run: str
    state: str
    node: str

    def check(self) -> None:
        if self.name_in_use is not True:
            raise DecodeError("'name_in_use' is not true")
        run_name(self.run)


@dataclass(frozen=True)
class KillReply(Reply):
    """``invoker kill --run`` (``--missing-ok``, ``--attempt``): the run's final record on the node, or
    ``missing`` (no such run there, or not this attempt's)."""

    WHAT: ClassVar[str] = "kill reply"
    SPARSE: ClassVar[frozenset[str]] = frozenset({"missing", "state"})

    run: str
    missing: bool = False
    state: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def check(self) -> None:
        run_name(self.run)
        run_state(self.state)


def _views(v: object) -> list[NodeRunView]:
    """The killed records, each decoded; one that does not decode is left out (``invoker status`` names it)."""
    if not isinstance(v, list):
        raise TypeError("a list of run records")
    if len(v) > MAX_ITEMS:
        raise DecodeError(f"too many run records ({len(v)}; at most {MAX_ITEMS})")
    out = []
    for rec in v:
        try:
            out.append(NodeRunView.from_dict(rec))
        except DecodeError:
            continue
    return out


@dataclass(frozen=True)
class KillTargetReply(Reply):
    """``invoker kill --target``: how many of the project's runs the target matched, and the final records
    of those it stopped."""

    WHAT: ClassVar[str] = "kill reply"

    matched: int
    killed: list[NodeRunView] = field(default_factory=list)

    @classmethod
    def decoders(cls) -> Mapping[str, Callable[[object], Any]]:
        return {"killed": _views}

    def check(self) -> None:
        nonnegative(self, "matched")


# -- stacks ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StacksReply(Reply):
    """``invoker stacks``: the Python stacks of a run's ranks on the node (:mod:`higgsfield.contract.stacks`).

    Taken now while the run is active there, else those saved at its stall (``saved``); none
    when it ended without stalling. ``state`` is the run's state on the node."""

    WHAT: ClassVar[str] = "stacks reply"

    run: str
    state: str
    ranks: list[RankStacks] = field(default_factory=list)
    saved: bool = False

    @classmethod
    def decoders(cls) -> Mapping[str, Callable[[object], Any]]:
        return {"ranks": each(RankStacks, "rank stack")}

    def check(self) -> None:
        run_name(self.run)
        run_state(self.state)

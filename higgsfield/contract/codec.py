"""The one codec of every type that crosses a seam: :func:`decode` a dataclass from parsed JSON, :func:`encode` it back.

A contract type is a plain (usually frozen) dataclass whose annotations say what each
field holds. :func:`decode` checks every value against its annotation, recursing into
nested types, and raises :class:`~higgsfield.contract.decode.DecodeError` in one line
naming the field's path (``'coordinator.port' must be an integer, not a string``,
``'ranks[2].threads[0].name' is missing``). :func:`encode` gives the JSON-able value
back, so no type writes its own ``to_dict``/``from_dict`` pair.

Why this and not msgspec (whose ``Struct`` does typed JSON with field paths, fast):
the contract is stdlib-only by rule (``.importlinter``: ``contract-stdlib-only``). The
node agent, the worker's entrypoint and the laptop all import it, and a compiled
dependency there is one more wheel every node and every container must match. The
checks beyond types (names that become paths, states, ranges) are ours to write either
way. Speed matters once: a status reply holds every run record a node keeps, hundreds
on a busy node, decoded on the node and again on the laptop. So each annotation's
decoder (:mod:`higgsfield.contract.values`) and each class's field plan are worked out
once, not asked of ``typing`` per value: 400 records decode in 23 ms, not 57.

What an annotation may be: ``str``, ``int`` (not a bool), ``float`` (finite; an int
reads as one), ``bool``, ``Any``/``object`` (as it is), a ``str`` :class:`~enum.Enum`
(by value), ``Literal[...]`` of strings, ``X | None``, ``list[X]``, ``tuple[X, ...]``,
``dict[str, X]`` and another dataclass. What a class may say, as ``ClassVar``s:

- ``WHAT``: how a message names it (``the start reply is a list, not an object``);
- ``VERSION`` / ``VERSION_KEY`` / ``VERSION_DEFAULT``: its schema's number, written by
  :func:`encode` and checked by :func:`decode` (a missing one reads as
  ``VERSION_DEFAULT``: an older writer's; ``None`` makes it required);
- ``SPARSE``: fields :func:`encode` leaves out while at their default (an older reader
  never saw them);
- ``UNKNOWN``: what a key with no field does: ``"ignore"`` (the default: a newer writer
  may add some), ``"refuse"`` (a spec a node must understand whole), or ``"extra"``
  (kept in the field ``extra`` and written back by :func:`encode`);
- ``TAG`` (with :func:`decode_tagged`): the message's kind on a tagged wire;
- a method ``check(self)``: the checks beyond the types, raising DecodeError (or
  ValueError/TypeError, which become one) in one line.

A field's own rules go in its metadata, built by :func:`rule`: ``check`` (a function of
the decoded value that raises ValueError/TypeError with the reason) and ``decode`` (a
function of the raw value that replaces the annotation's decoder: an error tail cut
to its last lines, a list whose bad items are skipped).

Use::

    spec = decode(RunSpec, json.loads(stdin))     # DecodeError: one line, naming the field
    print(json.dumps(encode(reply)))
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, fields, is_dataclass
from functools import cache
from typing import Any, TypeVar

from higgsfield.contract.decode import DecodeError, kind
from higgsfield.contract.text import shown
from higgsfield.contract.values import Decoder, WrongValue, at, decoder, where

T = TypeVar("T")

__all__ = ["DecodeError", "decode", "decode_tagged", "encode", "rule", "tag_of"]


def rule(*, check: Callable[[Any], Any] | None = None, decode: Callable[[object], Any] | None = None,
         sparse: bool = False) -> dict[str, Any]:
    """A field's metadata: ``field(default=..., metadata=rule(check=port))``.

    ``check`` gets the decoded value and raises ValueError/TypeError saying what is wrong
    (its return value, if not None, replaces the value: a normalised form). ``decode``
    gets the raw JSON value instead of the annotation's decoder. ``sparse``: left out
    by :func:`encode` while at its default, like the class's ``SPARSE``.
    """
    meta: dict[str, Any] = {}
    if check is not None:
        meta["check"] = check
    if decode is not None:
        meta["decode"] = decode
    if sparse:
        meta["sparse"] = True
    return meta


# -- decoding ---------------------------------------------------------------------------------------

@cache
def _hints(cls: type) -> dict[str, Any]:
    # no globalns: each class of the MRO reads its annotations in its own module (a message of
    # contract.gang that extends contract.failure's Verdict)
    return typing.get_type_hints(cls)


def _default(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def _what(cls: type) -> str:
    return getattr(cls, "WHAT", "") or "object"


def _check_version(cls: type, data: dict[str, Any]) -> None:
    want = getattr(cls, "VERSION", None)
    if want is None:
        return
    key = getattr(cls, "VERSION_KEY", "version")
    got = data.get(key, getattr(cls, "VERSION_DEFAULT", want))
    if got != want:
        raise DecodeError(f"the {_what(cls)} is of version {shown(got)} (this higgsfield reads {want}): "
                          "upgrade higgsfield here or on the node")


def _decoder(tp: Any) -> Decoder:
    """The decoder of annotation ``tp`` (:func:`~higgsfield.contract.values.decoder`), dataclasses decoded here."""
    return decoder(tp, _object_decoder)


@cache
def _object_decoder(cls: type) -> Decoder:
    return lambda v, path: _decode(cls, v, path)


@dataclass(frozen=True)
class _Field:
    """What decoding one field needs, worked out once per class (see :func:`_plan`)."""

    name: str
    decoder: Decoder
    own_decode: Callable[[object], Any] | None
    check: Callable[[Any], Any] | None
    optional: bool
    required: bool


@dataclass(frozen=True)
class _Plan:
    fields: tuple[_Field, ...]
    known: frozenset[str]
    unknown: str


@cache
def _plan(cls: type) -> _Plan:
    hints = _hints(cls)
    unknown = getattr(cls, "UNKNOWN", "ignore")
    own = [f for f in fields(cls) if f.init]  # type: ignore[arg-type]
    known = {f.name for f in own}
    if getattr(cls, "VERSION", None) is not None:
        known.add(getattr(cls, "VERSION_KEY", "version"))
    if getattr(cls, "TAG", None) is not None:
        known.add(getattr(cls, "TAG_KEY", "t"))
    plans = []
    for f in own:
        tp = hints[f.name]
        optional = typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)
        plans.append(_Field(f.name, _decoder(tp), f.metadata.get("decode"), f.metadata.get("check"), optional,
                            f.default is MISSING and f.default_factory is MISSING))
    return _Plan(tuple(plans), frozenset(known), unknown)


def _decode(cls: type[T], data: object, path: str) -> T:
    if not isinstance(data, dict):
        raise DecodeError(f"{where(path) if path else 'the ' + _what(cls)} is {kind(data)}, not an object")
    if not path:
        _check_version(cls, data)
    plan = _plan(cls)  # type: ignore[arg-type]
    known = plan.known
    if plan.unknown == "refuse":
        extra = sorted(k for k in data if k not in known)
        if extra:
            raise DecodeError(f"{', '.join(map(repr, extra[:5]))} unknown to this higgsfield "
                              f"in the {_what(cls)}")
    kwargs: dict[str, Any] = {}
    for f in plan.fields:
        if plan.unknown == "extra" and f.name == "extra":
            kwargs["extra"] = {k: v for k, v in data.items() if k not in known}
            continue
        here = at(path, f.name)
        v = data.get(f.name)
        if v is None:
            if f.optional and f.name in data:
                kwargs[f.name] = None
            elif f.required:
                raise DecodeError(f"'{here}' is missing")
            else:
                continue
        else:
            try:
                kwargs[f.name] = f.own_decode(v) if f.own_decode else f.decoder(v, here)
            except WrongValue as e:
                raise DecodeError(f"'{here}' must be {e.what}, not {kind(v)}") from None
            except (TypeError, ValueError) as e:
                if isinstance(e, DecodeError):
                    raise
                raise DecodeError(f"'{here}' must be {e}, not {kind(v)}") from None
        if f.check is not None and kwargs.get(f.name) is not None:
            try:
                fixed = f.check(kwargs[f.name])
            except DecodeError as e:
                raise DecodeError(f"'{here}': {e}") from None
            except (TypeError, ValueError) as e:
                raise DecodeError(f"'{here}' {e}") from None
            if fixed is not None:
                kwargs[f.name] = fixed
    obj = cls(**kwargs)
    own_check = getattr(obj, "check", None)
    if callable(own_check):
        try:
            own_check()
        except DecodeError as e:
            raise DecodeError(f"{path}: {e}" if path else str(e)) from None
        except (TypeError, ValueError) as e:
            raise DecodeError(f"{path + ': ' if path else ''}{e}") from None
    return obj


def decode(cls: type[T], data: object) -> T:
    """``data`` (parsed JSON) as a ``cls``, every field checked; :class:`DecodeError` names the field's path.

    A missing field takes its default (one without a default is an error), and so does
    null in a field that is not optional (a writer that left it empty).
    """
    assert is_dataclass(cls), cls
    return _decode(cls, data, "")


def tag_of(cls: type) -> str:
    """The kind a tagged message's class names itself by (``TAG``)."""
    tag = getattr(cls, "TAG", None)
    assert isinstance(tag, str), cls
    return tag


def decode_tagged(kinds: Mapping[str, type[T]], data: object, *, key: str = "t") -> T:
    """A message of a tagged wire: ``data[key]`` names its kind among ``kinds`` (tag -> class), decoded as that.

    An unknown kind, or a message that is not an object, is a DecodeError (the
    receiver logs it with the sender and drops it: a newer peer's message must never
    kill an older coordinator).
    """
    if not isinstance(data, dict):
        raise DecodeError(f"a message is {kind(data)}, not an object")
    t = data.get(key)
    if not isinstance(t, str) or t not in kinds:
        raise DecodeError(f"a message of unknown kind {shown(t)}")
    return decode(kinds[t], data)


# -- encoding ---------------------------------------------------------------------------------------

@cache
def _encoding(cls: type) -> tuple[dict[str, Any], tuple[tuple[str, Field[Any] | None], ...]]:
    """A class's tag key and value (none without a ``TAG``) and its fields but ``extra``, each with its Field
    when it is sparse (left out at its default): worked out once per class, as :func:`_plan` is."""
    fixed: dict[str, Any] = {}
    tag = getattr(cls, "TAG", None)
    if tag is not None:
        fixed[getattr(cls, "TAG_KEY", "t")] = tag
    sparse: frozenset[str] = getattr(cls, "SPARSE", frozenset())
    extra = getattr(cls, "UNKNOWN", "ignore") == "extra"
    out = tuple((f.name, f if f.name in sparse or f.metadata.get("sparse") else None)
                for f in fields(cls) if not (extra and f.name == "extra"))
    return fixed, out


def encode(obj: Any) -> Any:
    """``obj`` as JSON-able values: a dataclass as an object (its version and tag added, ``extra`` merged
    under its fields, sparse fields at their default left out), an enum as its value, a tuple as a list."""
    if is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        fixed, each = _encoding(cls)
        out: dict[str, Any] = {}
        if getattr(cls, "UNKNOWN", "ignore") == "extra":
            out.update(getattr(obj, "extra", None) or {})
        out.update(fixed)
        for name, sparse in each:
            v = getattr(obj, name)
            if sparse is not None and v == _default(sparse):
                continue
            out[name] = encode(v)
        version = getattr(cls, "VERSION", None)
        if version is not None:
            out[getattr(cls, "VERSION_KEY", "version")] = version
        return out
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [encode(x) for x in obj]
    if isinstance(obj, dict):
        return {k: encode(v) for k, v in obj.items()}
    return obj

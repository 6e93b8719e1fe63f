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
wire's messages are small (a spec, a reply, a gang message), so decode speed does not
matter, and the checks beyond types (names that become paths, states, ranges) are
ours to write either way.

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
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, fields, is_dataclass
from functools import cache
from typing import Any, TypeVar

from higgsfield.contract.decode import DecodeError, kind
from higgsfield.contract.text import shown

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

class _Wrong(Exception):
    """A value of the wrong type: ``what`` it must be (the caller adds the path and what it is)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


def _at(path: str, name: str | int) -> str:
    if isinstance(name, int):
        return f"{path}[{name}]"
    return f"{path}.{name}" if path else name


def _where(path: str) -> str:
    return f"'{path}'" if path else "the value"


@cache
def _hints(cls: type) -> dict[str, Any]:
    # no globalns: each class of the MRO reads its annotations in its own module (a message of
    # contract.gang that extends contract.failure's Verdict)
    return typing.get_type_hints(cls)


def _describe(tp: Any) -> str:
    """What a value of annotation ``tp`` is, for a message."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is str:
        return "a string"
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin in (list, tuple):
        return f"a list of {_plural(_describe(args[0]))}" if args else "a list"
    if origin is dict:
        return "an object" + (f" of {_plural(_describe(args[1]))}" if len(args) == 2 and args[1] is not Any else "")
    if is_dataclass(tp):
        return "an object"
    return getattr(tp, "__name__", str(tp))


def _plural(what: str) -> str:
    for a in ("a ", "an "):
        if what.startswith(a):
            noun = what[len(a):]
            return noun if noun.endswith("s") else noun + "s"
    return what


def _value(tp: Any, v: object, path: str) -> Any:
    """``v`` decoded as ``tp`` (DecodeError names ``path`` when a nested value is wrong; _Wrong when ``v`` is)."""
    if tp is Any or tp is object:
        return v
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if v is None and len(inner) < len(args):
            return None
        if len(inner) == 1:
            return _value(inner[0], v, path)
        for a in inner:     # a plain union: the first that takes it
            try:
                return _value(a, v, path)
            except (_Wrong, DecodeError):
                continue
        raise _Wrong(" or ".join(_describe(a) for a in inner))
    if tp is str:
        if not isinstance(v, str):
            raise _Wrong("a string")
        return v
    if tp is bool:
        if not isinstance(v, bool):
            raise _Wrong("true or false")
        return v
    if tp is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise _Wrong("an integer")
        return v
    if tp is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(_float_or_inf(v)):
            raise _Wrong("a number")
        return float(v)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(v)
        except ValueError:
            raise _Wrong(_describe(tp)) from None
    if origin is typing.Literal:
        if v not in args or type(v) is not type(next(a for a in args if a == v)):
            raise _Wrong(_describe(tp))
        return v
    if origin in (list, tuple):
        if not isinstance(v, list):
            raise _Wrong(_describe(tp))
        item = args[0] if args else Any
        out = [_item(item, x, _at(path, i)) for i, x in enumerate(v)]
        return tuple(out) if origin is tuple else out
    if origin is dict or tp is dict:
        if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
            raise _Wrong(_describe(tp))
        item = args[1] if len(args) == 2 else Any
        return {k: _item(item, x, _at(path, k)) for k, x in v.items()}
    if origin is list or tp is list:
        if not isinstance(v, list):
            raise _Wrong("a list")
        return list(v)
    if is_dataclass(tp) and isinstance(tp, type):
        return _decode(tp, v, path)
    raise TypeError(f"no decoder for a field of type {tp!r}")   # a contract type's mistake, not the data's


def _float_or_inf(v: float) -> float:
    """``v`` as a float; an integer no float holds (JSON's ``1e400`` written out) as infinity."""
    try:
        return float(v)
    except OverflowError:
        return math.inf


def _item(tp: Any, v: object, path: str) -> Any:
    try:
        return _value(tp, v, path)
    except _Wrong as e:
        raise DecodeError(f"{_where(path)} must be {e.what}, not {kind(v)}") from None


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


def _decode(cls: type[T], data: object, path: str) -> T:
    if not isinstance(data, dict):
        raise DecodeError(f"{_where(path) if path else 'the ' + _what(cls)} is {kind(data)}, not an object")
    if not path:
        _check_version(cls, data)
    hints = _hints(cls)  # type: ignore[arg-type]
    unknown = getattr(cls, "UNKNOWN", "ignore")
    own = [f for f in fields(cls) if f.init]  # type: ignore[arg-type]
    known = {f.name for f in own}
    if getattr(cls, "VERSION", None) is not None:
        known.add(getattr(cls, "VERSION_KEY", "version"))
    tag_key = getattr(cls, "TAG_KEY", "t")
    if getattr(cls, "TAG", None) is not None:
        known.add(tag_key)
    if unknown == "refuse":
        extra = sorted(k for k in data if k not in known)
        if extra:
            raise DecodeError(f"{', '.join(map(repr, extra[:5]))} unknown to this higgsfield "
                              f"in the {_what(cls)}")
    kwargs: dict[str, Any] = {}
    for f in own:
        if unknown == "extra" and f.name == "extra":
            kwargs["extra"] = {k: v for k, v in data.items() if k not in known}
            continue
        where = _at(path, f.name)
        v = data.get(f.name)
        tp = hints[f.name]
        if v is None:
            optional = typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)
            if optional and f.name in data:
                kwargs[f.name] = None
            elif _default(f) is MISSING:
                raise DecodeError(f"'{where}' is missing")
            else:
                continue
        else:
            own_decode = f.metadata.get("decode")
            try:
                kwargs[f.name] = own_decode(v) if own_decode else _value(tp, v, where)
            except _Wrong as e:
                raise DecodeError(f"'{where}' must be {e.what}, not {kind(v)}") from None
            except (TypeError, ValueError) as e:
                if isinstance(e, DecodeError):
                    raise
                raise DecodeError(f"'{where}' must be {e}, not {kind(v)}") from None
        check = f.metadata.get("check")
        if check is not None and kwargs.get(f.name) is not None:
            try:
                fixed = check(kwargs[f.name])
            except DecodeError as e:
                raise DecodeError(f"'{where}': {e}") from None
            except (TypeError, ValueError) as e:
                raise DecodeError(f"'{where}' {e}") from None
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

def encode(obj: Any) -> Any:
    """``obj`` as JSON-able values: a dataclass as an object (its version and tag added, ``extra`` merged
    under its fields, sparse fields at their default left out), an enum as its value, a tuple as a list."""
    if is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        out: dict[str, Any] = {}
        unknown = getattr(cls, "UNKNOWN", "ignore")
        if unknown == "extra":
            out.update(getattr(obj, "extra", None) or {})
        tag = getattr(cls, "TAG", None)
        if tag is not None:
            out[getattr(cls, "TAG_KEY", "t")] = tag
        sparse: frozenset[str] = getattr(cls, "SPARSE", frozenset())
        for f in fields(obj):
            if unknown == "extra" and f.name == "extra":
                continue
            v = getattr(obj, f.name)
            if (f.name in sparse or f.metadata.get("sparse")) and v == _default(f):
                continue
            out[f.name] = encode(v)
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


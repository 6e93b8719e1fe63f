"""How a value is checked against its annotation: the codec's decoders, one per kind of annotation.

:func:`decoder` works out, once per annotation, the function that checks a raw JSON
value and gives it typed. A decoder raises :class:`WrongValue` when the value itself is of
the wrong kind (the caller adds its path and what it is) and
:class:`~higgsfield.contract.decode.DecodeError` when a value inside it is (a list's
item, a nested object's field), naming that value's path. The dataclass case is the
codec's (:mod:`higgsfield.contract.codec`), which hands it in.
"""

from __future__ import annotations

import enum
import math
import types
import typing
from collections.abc import Callable
from dataclasses import is_dataclass
from functools import cache
from typing import Any

from higgsfield.contract.decode import DecodeError, kind

__all__ = ["Decoder", "WrongValue", "at", "decoder", "describe", "item", "where"]


class WrongValue(Exception):
    """A value of the wrong type: ``what`` it must be (the caller adds the path and what it is)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


def at(path: str, name: str | int) -> str:
    """The path of a field or an item under ``path``: ``ranks[2].threads``."""
    if isinstance(name, int):
        return f"{path}[{name}]"
    return f"{path}.{name}" if path else name


def where(path: str) -> str:
    """A path as a message names it."""
    return f"'{path}'" if path else "the value"


def describe(tp: Any) -> str:
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
        return f"a list of {_plural(describe(args[0]))}" if args else "a list"
    if origin is dict:
        return "an object" + (f" of {_plural(describe(args[1]))}" if len(args) == 2 and args[1] is not Any else "")
    if is_dataclass(tp):
        return "an object"
    return getattr(tp, "__name__", str(tp))


def _plural(what: str) -> str:
    for a in ("a ", "an "):
        if what.startswith(a):
            noun = what[len(a):]
            return noun if noun.endswith("s") else noun + "s"
    return what


Decoder = Callable[[object, str], Any]
"""Decodes a raw value found at a path: returns it typed, raises :class:`WrongValue` when the value itself is of
the wrong kind (the caller names it) and :class:`DecodeError` when a value inside it is."""


@cache
def decoder(tp: Any, of_object: Callable[[type], Decoder]) -> Decoder:
    """The decoder of annotation ``tp``, worked out once per annotation: a ``status`` decodes hundreds of
    records of one type, and asking ``typing`` about every field of every record was most of its decoding.
    ``of_object`` gives a dataclass's decoder (the codec's: this module knows no dataclass)."""
    if tp is Any or tp is object:
        return lambda v, path: v
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _union(args, of_object)
    if tp is str:
        return _str
    if tp is bool:
        return _bool
    if tp is int:
        return _int
    if tp is float:
        return _float
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum(tp)
    if origin is typing.Literal:
        return _literal(tp, args)
    if origin in (list, tuple):
        return _sequence(tp, decoder(args[0] if args else Any, of_object), origin is tuple)
    if origin is dict or tp is dict:
        return _mapping(tp, decoder(args[1] if len(args) == 2 else Any, of_object))
    if tp is list:
        return _bare_list
    if is_dataclass(tp) and isinstance(tp, type):
        return of_object(tp)

    def unknown(v: object, path: str) -> Any:
        raise TypeError(f"no decoder for a field of type {tp!r}")   # a contract type's mistake, not the data's
    return unknown


def _union(args: tuple[Any, ...], of_object: Callable[[type], Decoder]) -> Decoder:
    inner = [a for a in args if a is not type(None)]
    nullable = len(inner) < len(args)
    if len(inner) == 1:
        one = decoder(inner[0], of_object)
        return (lambda v, path: None if v is None else one(v, path)) if nullable else one
    each = [decoder(a, of_object) for a in inner]
    what = " or ".join(describe(a) for a in inner)

    def union(v: object, path: str) -> Any:
        if v is None and nullable:
            return None
        for d in each:     # a plain union: the first that takes it
            try:
                return d(v, path)
            except (WrongValue, DecodeError):
                continue
        raise WrongValue(what)
    return union


def _str(v: object, path: str) -> str:
    if not isinstance(v, str):
        raise WrongValue("a string")
    return v


def _bool(v: object, path: str) -> bool:
    if not isinstance(v, bool):
        raise WrongValue("true or false")
    return v


def _int(v: object, path: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise WrongValue("an integer")
    return v


def _float(v: object, path: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(_float_or_inf(v)):
        raise WrongValue("a number")
    return float(v)


def _enum(tp: type[enum.Enum]) -> Decoder:
    def member(v: object, path: str) -> Any:
        try:
            return tp(v)
        except ValueError:
            raise WrongValue(describe(tp)) from None
    return member


def _literal(tp: Any, args: tuple[Any, ...]) -> Decoder:
    def literal(v: object, path: str) -> Any:
        if v not in args or type(v) is not type(next(a for a in args if a == v)):
            raise WrongValue(describe(tp))
        return v
    return literal


def _sequence(tp: Any, each: Decoder, as_tuple: bool) -> Decoder:
    def sequence(v: object, path: str) -> Any:
        if not isinstance(v, list):
            raise WrongValue(describe(tp))
        out = [item(each, x, at(path, i)) for i, x in enumerate(v)]
        return tuple(out) if as_tuple else out
    return sequence


def _mapping(tp: Any, each: Decoder) -> Decoder:
    def mapping(v: object, path: str) -> Any:
        if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
            raise WrongValue(describe(tp))
        return {k: item(each, x, at(path, k)) for k, x in v.items()}
    return mapping


def _bare_list(v: object, path: str) -> list[Any]:
    if not isinstance(v, list):
        raise WrongValue("a list")
    return list(v)


def _float_or_inf(v: float) -> float:
    """``v`` as a float; an integer no float holds (JSON's ``1e400`` written out) as infinity."""
    try:
        return float(v)
    except OverflowError:
        return math.inf


def item(each: Decoder, v: object, path: str) -> Any:
    """An item of a list or an object at ``path``: a wrong kind of value is a DecodeError naming it."""
    try:
        return each(v, path)
    except WrongValue as e:
        raise DecodeError(f"{where(path)} must be {e.what}, not {kind(v)}") from None

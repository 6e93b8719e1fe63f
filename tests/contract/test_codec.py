"""The one codec: every annotation a contract type uses, the field path in every error, and encode as its inverse."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from higgsfield.contract.codec import DecodeError, decode, decode_tagged, encode, rule


class Color(str, enum.Enum):
    RED = "red"
    BLUE = "blue"


def _port(v: int) -> None:
    if not 0 < v < 65536:
        raise ValueError("must be a TCP port")


@dataclass(frozen=True)
class Inner:
    host: str
    port: int = field(default=1, metadata=rule(check=_port))


@dataclass(frozen=True)
class Outer:
    WHAT: ClassVar[str] = "outer thing"
    VERSION: ClassVar[int] = 2
    SPARSE: ClassVar[frozenset[str]] = frozenset({"note"})

    name: str
    inner: Inner
    items: list[Inner] = field(default_factory=list)
    nodes: tuple[str, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)
    color: Color = Color.RED
    mode: Literal["a", "b"] = "a"
    ratio: float = 0.5
    maybe: int | None = None
    note: str = ""
    anything: Any = None


@dataclass(frozen=True)
class Open:
    UNKNOWN: ClassVar[str] = "extra"
    run: str
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Closed:
    WHAT: ClassVar[str] = "spec"
    UNKNOWN: ClassVar[str] = "refuse"
    run: str


@dataclass(frozen=True)
class Ping:
    TAG: ClassVar[str] = "ping"
    n: int

    def check(self) -> None:
        if self.n < 0:
            raise ValueError("'n' must not be negative")


@dataclass(frozen=True)
class Pong:
    TAG: ClassVar[str] = "pong"
    port: int


GOOD = {"name": "x", "inner": {"host": "h", "port": 80}, "items": [{"host": "a"}], "nodes": ["n1", "n2"],
        "counts": {"a": 1}, "color": "blue", "mode": "b", "ratio": 1, "maybe": None, "version": 2}


def test_decode_types_every_annotation_and_encode_gives_it_back():
    o = decode(Outer, GOOD)
    assert o.inner == Inner("h", 80) and o.items == [Inner("a", 1)] and o.nodes == ("n1", "n2")
    assert o.color is Color.BLUE and o.mode == "b" and o.ratio == 1.0 and isinstance(o.ratio, float)
    assert decode(Outer, encode(o)) == o
    out = encode(o)
    assert "note" not in out and out["version"] == 2 and out["color"] == "blue" and out["nodes"] == ["n1", "n2"]
    assert json.loads(json.dumps(out)) == out


@pytest.mark.parametrize("change, message", [
    ({"inner": {"host": "h", "port": "80"}}, "'inner.port' must be an integer, not a string"),
    ({"inner": {"host": "h", "port": 0}}, "'inner.port' must be a TCP port"),
    ({"inner": {"port": 1}}, "'inner.host' is missing"),
    ({"items": [{"host": "a"}, {"host": 3}]}, "'items[1].host' must be a string, not a number"),
    ({"nodes": ["a", 1]}, "'nodes[1]' must be a string, not a number"),
    ({"counts": {"a": True}}, "'counts.a' must be an integer, not a boolean"),
    ({"color": "green"}, "'color' must be one of red, blue, not a string"),
    ({"mode": "c"}, "'mode' must be one of a, b, not a string"),
    ({"ratio": float("nan")}, "'ratio' must be a number"),
    ({"name": None}, "'name' is missing"),
    ({"version": 3}, "the outer thing is of version 3 (this higgsfield reads 2)"),
])
def test_decode_names_the_field_path(change, message):
    with pytest.raises(DecodeError) as e:
        decode(Outer, {**GOOD, **change})
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_not_an_object_is_one_line():
    with pytest.raises(DecodeError, match="the outer thing is a list, not an object"):
        decode(Outer, [])


def test_unknown_keys_ignored_kept_or_refused():
    assert decode(Inner, {"host": "h", "new": 1}) == Inner("h")
    o = decode(Open, {"run": "r", "pid": 7})
    assert o.extra == {"pid": 7} and encode(o) == {"pid": 7, "run": "r"}
    with pytest.raises(DecodeError, match="'pid' unknown to this higgsfield in the spec"):
        decode(Closed, {"run": "r", "pid": 7})


def test_tagged_messages_dispatch_on_their_kind():
    assert decode_tagged({"ping": Ping, "pong": Pong}, {"t": "pong", "port": 5}) == Pong(5)
    assert encode(Ping(3)) == {"t": "ping", "n": 3}
    with pytest.raises(DecodeError, match="unknown kind 'boom'"):
        decode_tagged({"ping": Ping}, {"t": "boom"})
    with pytest.raises(DecodeError, match="'n' must not be negative"):
        decode_tagged({"ping": Ping}, {"t": "ping", "n": -1})
    with pytest.raises(DecodeError, match="not an object"):
        decode_tagged({"ping": Ping}, "ping")


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
                           max_leaves=10)


@settings(max_examples=100, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(sorted(GOOD) + ["other"]), json_values, max_size=8))
def test_any_json_decodes_or_is_one_decode_error(data):
    try:
        decode(Outer, {**GOOD, **data})
    except DecodeError as e:
        assert "\n" not in str(e)

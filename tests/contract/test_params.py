"""Param typing: what ``@param`` declares and how text values become typed values."""

from __future__ import annotations

import json

import pytest

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.errors import ExperimentError, ParamError
from higgsfield.contract.params import RESERVED, ParamSpec, parse_assignments, parse_bool, resolve


@pytest.mark.parametrize("text", ["true", "True", "TRUE", "1", "yes", "Yes", "YES", " true ", "on", "y"])
def test_bool_true(text: str) -> None:
    assert parse_bool(text) is True


@pytest.mark.parametrize("text", ["false", "False", "FALSE", "0", "no", "No", "NO", "off", "n"])
def test_bool_false(text: str) -> None:
    assert parse_bool(text) is False


@pytest.mark.parametrize("value", ["", "maybe", "2", "tru", 2, -1, 0.5, None, [True]])
def test_bool_refuses(value: object) -> None:
    with pytest.raises(ValueError, match="expected true or false"):
        parse_bool(value)


def test_bool_passthrough() -> None:
    assert parse_bool(True) is True and parse_bool(False) is False
    assert parse_bool(1) is True and parse_bool(0) is False


def test_false_string_is_false_not_truthy() -> None:
    spec = ParamSpec.build("fast", default=True)
    assert spec.type == "bool"
    assert spec.coerce("false") is False
    assert spec.coerce("False") is False
    assert spec.coerce("0") is False


@pytest.mark.parametrize(("type_", "text", "expected"), [
    ("int", "3", 3), ("int", " 42 ", 42), ("int", "1e3", 1000), ("int", 7, 7), ("int", 2.0, 2),
    ("float", "0.5", 0.5), ("float", "1e-5", 1e-5), ("float", 3, 3.0), ("float", "-2", -2.0),
    ("str", "hello", "hello"), ("str", "", ""), ("str", 3, "3"),
    ("bool", "yes", True), ("bool", "No", False),
])
def test_coerce_types(type_: str, text: object, expected: object) -> None:
    out = ParamSpec.build("p", type=type_).coerce(text)
    assert out == expected and type(out) is type(expected)


@pytest.mark.parametrize(("type_", "value", "message"), [
    ("int", "3.5", "param 'p': expected an integer, got '3.5'"),
    ("int", "abc", "param 'p': expected an integer, got 'abc'"),
    ("int", True, "param 'p': expected an integer, got True"),
    ("float", "fast", "param 'p': expected a number, got 'fast'"),
    ("float", "nan", "param 'p': expected a finite number, got 'nan'"),
    ("float", "inf", "param 'p': expected a finite number, got 'inf'"),
    ("float", False, "param 'p': expected a number, got False"),
    ("bool", "maybe", "param 'p': expected true or false, got 'maybe'"),
    ("str", None, "param 'p': expected a string, got None"),
])
def test_coerce_refuses(type_: str, value: object, message: str) -> None:
    with pytest.raises(ParamError) as info:
        ParamSpec.build("p", type=type_).coerce(value)
    assert str(info.value) == message


def test_type_inferred_from_default_and_options() -> None:
    assert ParamSpec.build("a", default=3).type == "int"
    assert ParamSpec.build("a", default=0.1).type == "float"
    assert ParamSpec.build("a", default=False).type == "bool"
    assert ParamSpec.build("a", default="x").type == "str"
    assert ParamSpec.build("a").type == "str"
    assert ParamSpec.build("a", options=[1, 2]).type == "int"
    assert ParamSpec.build("a", type=float).type == "float"   # a builtin type object also works


def test_default_converted_to_declared_type() -> None:
    spec = ParamSpec.build("lr", default=1, type="float")
    assert spec.default == 1.0 and isinstance(spec.default, float)
    assert ParamSpec.build("n", default="8", type="int").default == 8


def test_options_enforced() -> None:
    spec = ParamSpec.build("size", default="7b", options=["7b", "13b", "70b"])
    assert spec.options == ("7b", "13b", "70b")
    assert spec.coerce("13b") == "13b"
    with pytest.raises(ParamError) as info:
        spec.coerce("30b")
    assert str(info.value) == "param 'size': '30b' is not one of ['7b', '13b', '70b']"
    ints = ParamSpec.build("n", options=[1, 2, 4])
    assert ints.coerce("4") == 4
    with pytest.raises(ParamError, match=r"^param 'n': 3 is not one of \[1, 2, 4\]$"):
        ints.coerce("3")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": "1x"}, "@param name '1x' is not valid"),
    ({"name": "a-b"}, "@param name 'a-b' is not valid"),
    ({"name": "x" * 65}, "is not valid: use 1-64 letters"),
    ({"name": "p", "type": "list"}, "@param 'p': type must be int, float, str or bool (got 'list')"),
    ({"name": "p", "type": dict}, "@param 'p': type must be int, float, str or bool"),
    ({"name": "p", "default": "7b", "options": ["13b", "70b"]},
     "@param 'p': default '7b' is not one of the options ['13b', '70b']"),
    ({"name": "p", "options": []}, "@param 'p': options must be a non-empty list"),
    ({"name": "p", "options": "abc"}, "@param 'p': options must be a non-empty list"),
    ({"name": "p", "options": [1, 1]}, "@param 'p': options repeat a value"),
    ({"name": "p", "type": "int", "options": ["a"]}, "@param 'p': option expected an integer, got 'a'"),
    ({"name": "p", "type": "int", "default": "x"}, "@param 'p': default expected an integer, got 'x'"),
    ({"name": "p", "default": [1, 2], "type": "str"}, "@param 'p': default must be an int, float, str or bool"),
    ({"name": "p", "required": True, "default": 1}, "@param 'p': a required param cannot have a default"),
    ({"name": "p", "required": "yes"}, "@param 'p': required must be True or False"),
    ({"name": "p", "description": 3}, "@param 'p': description must be a string"),
])
def test_build_refuses(kwargs: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError) as info:
        ParamSpec.build(**kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize("name", sorted(RESERVED))
def test_reserved_names_refused(name: str) -> None:
    with pytest.raises(ValueError, match=f"@param name '{name}' is reserved"):
        ParamSpec.build(name)


def test_reserved_covers_runtime_context() -> None:
    assert {"rank", "world_size", "local_rank", "project_name", "experiment_name", "run_name", "seed"} <= RESERVED


def test_resolve_fills_defaults_and_types_values() -> None:
    specs = [ParamSpec.build("lr", default=0.1), ParamSpec.build("fast", default=False),
             ParamSpec.build("size", default="7b", options=["7b", "13b"]), ParamSpec.build("steps", type="int")]
    assert resolve(specs, {"lr": "0.5", "fast": "false"}) == {"lr": 0.5, "fast": False, "size": "7b", "steps": None}
    assert resolve(specs, {"fast": "YES", "steps": "10"})["fast"] is True


def test_resolve_required_enforced() -> None:
    specs = [ParamSpec.build("data", required=True), ParamSpec.build("lr", default=0.1)]
    with pytest.raises(ParamError) as info:
        resolve(specs, {"lr": "1"}, "alpaca")
    assert str(info.value) == "experiment 'alpaca': param 'data' is required: pass --param data=VALUE"
    assert resolve(specs, {"data": "s3://x"})["data"] == "s3://x"


def test_resolve_unknown_and_bad_values() -> None:
    specs = [ParamSpec.build("lr", default=0.1)]
    with pytest.raises(ParamError, match=r"^experiment 'e': unknown param 'lrr' \(params: lr\)$"):
        resolve(specs, {"lrr": "1"}, "e")
    with pytest.raises(ParamError, match=r"^experiment 'e': param 'lr': expected a number, got 'fast'$"):
        resolve(specs, {"lr": "fast"}, "e")


def test_param_errors_are_experiment_errors() -> None:
    # the CLI maps ExperimentError (and so ParamError) to exit code 2
    assert issubclass(ParamError, ExperimentError)
    assert ParamError("x").exit_code == 2


def test_parse_assignments() -> None:
    assert parse_assignments(["lr=0.1", "name=a=b", "empty="]) == {"lr": "0.1", "name": "a=b", "empty": ""}
    with pytest.raises(ParamError, match="expected NAME=VALUE"):
        parse_assignments(["lr"])
    with pytest.raises(ParamError, match="expected NAME=VALUE"):
        parse_assignments(["=3"])
    with pytest.raises(ParamError, match="--param lr is given twice"):
        parse_assignments(["lr=1", "lr=2"])


def test_spec_dict_round_trip() -> None:
    spec = ParamSpec.build("size", default="7b", options=["7b", "13b"], description="model size")
    assert decode(ParamSpec, json.loads(json.dumps(encode(spec)))) == spec

"""The runtime decorators (higgsfield.experiment) agree with AST discovery on the same sources."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest
from helpers_project import BODY, IMPORT_STYLES, write

import higgsfield.experiment as hx
from higgsfield.contract.errors import ExperimentError, ParamError
from higgsfield.control.project.discovery import discover
from higgsfield.experiment import Params, experiment, param, registry


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no registered experiment (the registry is process-global)."""
    monkeypatch.setattr(hx, "_REGISTRY", {})


def _import(file: Path, name: str) -> None:
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)


@pytest.mark.parametrize("source", list(IMPORT_STYLES.values()), ids=list(IMPORT_STYLES))
def test_runtime_agrees_with_discovery(tmp_path: Path, source: str) -> None:
    file = write(tmp_path / "src" / "mod.py", source + BODY)
    (found,) = discover(tmp_path / "src")
    _import(file, f"hf_test_mod_{abs(hash(source))}")
    exp = registry()[found.name]
    assert exp.seed == found.seed
    assert exp.params == list(found.params)


@pytest.mark.slow  # it imports torch
def test_the_scaffold_example_agrees(tmp_path: Path) -> None:
    from higgsfield.control.project.scaffold import render

    file = write(tmp_path / "src" / "example.py", render("demo")["src/example.py"])
    (found,) = discover(tmp_path / "src")
    pytest.importorskip("torch")
    _import(file, "hf_test_example")
    assert registry()["example"].params == list(found.params)
    assert registry()["example"].seed == found.seed == 0


def test_decorators_return_the_function_unchanged() -> None:
    def train(params: Params) -> int:
        return 42

    decorated = param("lr", default=0.1)(experiment("plain")(train))
    assert decorated is train
    assert train(Params()) == 42


def test_params_carry_values_and_context() -> None:
    @experiment("ctx", seed=7)
    @param("lr", default=0.1)
    @param("fast", default=True)
    @param("size", default="7b", options=["7b", "13b"])
    def train(params: Params) -> Params:
        return params

    exp = registry()["ctx"]
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "PROJECT_NAME": "proj", "RUN_NAME": "r1"}
    p = exp.build_params({"lr": "0.5", "fast": "false", "size": "13b"}, env=env)
    assert (p.lr, p.fast, p.size) == (0.5, False, "13b")
    assert p["lr"] == 0.5
    assert (p.rank, p.world_size, p.local_rank) == (3, 8, 1)
    assert (p.project_name, p.experiment_name, p.run_name, p.seed) == ("proj", "ctx", "r1", 7)
    with pytest.raises(AttributeError, match="params has no 'nope'"):
        _ = p.nope
    defaults = exp.build_params({}, env={})
    assert (defaults.lr, defaults.fast, defaults.size, defaults.rank, defaults.world_size) == (0.1, True, "7b", 0, 1)


def test_calling_the_experiment_validates_and_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Params] = []

    @experiment("call", seed=3)
    @param("steps", required=True, type=int)
    def train(params: Params) -> None:
        seen.append(params)

    seeds: list[int] = []
    monkeypatch.setattr(hx, "seed_everything", seeds.append)
    registry()["call"]({"steps": "5"})
    assert seen[0].steps == 5 and seeds == [3]
    with pytest.raises(ParamError, match="experiment 'call': param 'steps' is required"):
        registry()["call"]({})
    with pytest.raises(ParamError, match="experiment 'call': param 'steps': expected an integer"):
        registry()["call"]({"steps": "many"})


@pytest.mark.parametrize(("build", "message"), [
    (lambda: experiment("bad-name"), "experiment name 'bad-name' is not valid"),
    (lambda: experiment("e", seed="1"), "@experiment('e'): seed must be an integer"),
    (lambda: param("rank"), "@param name 'rank' is reserved"),
    (lambda: param("x", type="list"), "@param 'x': type must be int, float, str or bool (got 'list')"),
    (lambda: param("size", default="7b", options=["13b"]), "@param 'size': default '7b' is not one of the options"),
    (lambda: param("class", default=1), "@param name 'class' is a Python keyword: choose another name"),
    (lambda: param("items", default=1), "@param name 'items' is taken by the params object itself"),
    (lambda: param("x\n", default=1), "@param name 'x\\n' is not valid"),
    (lambda: experiment("e\n"), "experiment name 'e\\n' is not valid"),
    (lambda: param("x", options=5), "@param 'x': options must be a non-empty list"),
    (lambda: param("x", default="a\x00"), "a NUL character cannot be a param value"),
])
def test_runtime_refuses_what_discovery_refuses(build: object, message: str) -> None:
    with pytest.raises(ExperimentError) as info:
        build()  # type: ignore[operator]
    assert message in str(info.value)


def test_same_errors_from_discovery(tmp_path: Path) -> None:
    for call in ('experiment("bad-name")', 'experiment("e")\n@param("rank")',
                 'experiment("e")\n@param("x", type="list")', 'experiment("e")\n@param("class")',
                 'experiment("e")\n@param("keys")', 'experiment("e\\n")'):
        write(tmp_path / "src" / "m.py", textwrap.dedent(f"""\
            from higgsfield.experiment import experiment, param
            @{call}
            def f(params): pass
            """))
        with pytest.raises(ExperimentError):
            discover(tmp_path / "src")


def test_param_declared_twice_and_experiment_defined_twice() -> None:
    def f(params: Params) -> None: ...

    def g(params: Params) -> None: ...

    with pytest.raises(ExperimentError, match="@param 'x' is declared twice"):
        param("x")(param("x")(f))
    experiment("twice")(f)
    experiment("twice")(f)  # re-registering the same function (a re-import) is fine
    with pytest.raises(ExperimentError, match="experiment 'twice' is defined twice"):
        experiment("twice")(g)

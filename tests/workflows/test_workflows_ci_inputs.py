"""What a GitHub job hands to `higgsfield ci`: form values from env vars, typed exactly as `higgsfield run`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from wf_helpers import make_project

from higgsfield.contract.errors import ConfigError, ParamError
from higgsfield.contract.params import parse_assignments, resolve
from higgsfield.control.config import load_config
from higgsfield.control.project.discovery import find_experiment
from higgsfield.control.workflows.ci_inputs import ci_config, kill_target, parse_more_params, run_inputs


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "proj")


@pytest.fixture()
def alpaca(project: Path):  # type: ignore[no-untyped-def]
    return find_experiment(project / "src", "alpaca")


def form(**values: str) -> dict[str, str]:
    """The env a run job sets: every input present, "" when left empty (as GitHub sends it)."""
    env = {"HIGGSFIELD_RUN_NAME": "", "HIGGSFIELD_NODES": ""}
    for name in ("lr", "steps", "size", "shards", "fast", "data", "note", "on"):
        env[f"HIGGSFIELD_PARAM_{name}"] = ""
    env.update({k if k.startswith("HIGGSFIELD_") else f"HIGGSFIELD_PARAM_{k}": v for k, v in values.items()})
    return env


def test_values_are_typed_like_higgsfield_run(alpaca) -> None:  # type: ignore[no-untyped-def]
    got = run_inputs(alpaca, form(lr="0.01", steps="50", size="13b", shards="4", fast="true", data="d.jsonl",
                                  note="$(id)", on="false"), total_nodes=2)
    assert got.typed == {"lr": 0.01, "steps": 50, "size": "13b", "shards": 4, "fast": True, "data": "d.jsonl",
                         "note": "$(id)", "on": False}
    assert isinstance(got.typed["steps"], int) and got.typed["fast"] is True
    # the text handed to start_run is what `higgsfield run --param k=v` passes, and resolves the same
    cli = parse_assignments(["lr=0.01", "steps=50", "size=13b", "shards=4", "fast=true", "data=d.jsonl",
                             "note=$(id)", "on=false"])
    assert got.params == cli
    assert resolve(alpaca.params, got.params, "alpaca") == got.typed
    assert got.run_name is None and got.nodes is None and got.not_passed == ()


def test_empty_optional_fields_take_their_defaults(alpaca) -> None:  # type: ignore[no-untyped-def]
    got = run_inputs(alpaca, form(data="x"), total_nodes=2)
    assert got.params == {"data": "x", "note": ""}
    assert got.typed["lr"] == 0.001 and got.typed["steps"] == 100 and got.typed["size"] == "7b"
    assert got.typed["fast"] is False and got.typed["on"] is None
    # a string field with a default that the user cleared means the empty string
    assert got.typed["note"] == ""


def test_required_and_invalid_values_fail_naming_the_field(alpaca) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ParamError, match="param 'data' is required"):
        run_inputs(alpaca, form(), total_nodes=2)
    with pytest.raises(ParamError, match="param 'steps': expected an integer, got 'many'"):
        run_inputs(alpaca, form(data="x", steps="many"), total_nodes=2)
    with pytest.raises(ParamError, match=r"param 'size': '1b' is not one of"):
        run_inputs(alpaca, form(data="x", size="1b"), total_nodes=2)
    with pytest.raises(ParamError, match="param 'fast': expected true or false"):
        run_inputs(alpaca, form(data="x", fast="maybe"), total_nodes=2)


def test_stale_workflows_are_detected(alpaca) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ParamError, match="no param 'gone'.*build-experiments"):
        run_inputs(alpaca, form(data="x", gone="1"), total_nodes=2)
    env = form(data="x")
    del env["HIGGSFIELD_PARAM_on"]
    assert run_inputs(alpaca, env, total_nodes=2).not_passed == ("on",)


def test_run_name_and_nodes(alpaca) -> None:  # type: ignore[no-untyped-def]
    got = run_inputs(alpaca, form(data="x", HIGGSFIELD_RUN_NAME=" lr-sweep.1 ", HIGGSFIELD_NODES="2"), 2)
    assert got.run_name == "lr-sweep.1" and got.nodes == 2
    assert run_inputs(alpaca, form(data="x", HIGGSFIELD_NODES="1.0"), 2).nodes == 1
    for bad in ("3", "0", "-1", "1.5", "two"):
        with pytest.raises(ParamError, match="nodes must be"):
            run_inputs(alpaca, form(data="x", HIGGSFIELD_NODES=bad), 2)
    for bad in ("a b", "$(id)", "-x", "x" * 97, "a/b", "ru\nn", ".hidden"):
        with pytest.raises(ParamError, match="run_name"):
            run_inputs(alpaca, form(data="x", HIGGSFIELD_RUN_NAME=bad), 2)


def test_stall_timeout(alpaca) -> None:  # type: ignore[no-untyped-def]
    from higgsfield.control.workflows.ci_inputs import parse_stall_timeout

    assert run_inputs(alpaca, form(data="x"), 2).stall_timeout is None          # not passed: higgsfield.yml's
    assert run_inputs(alpaca, form(data="x", HIGGSFIELD_STALL_TIMEOUT=""), 2).stall_timeout is None
    assert run_inputs(alpaca, form(data="x", HIGGSFIELD_STALL_TIMEOUT="90"), 2).stall_timeout == 90.0
    assert parse_stall_timeout(" 0 ") == 0.0 and parse_stall_timeout("1.5") == 1.5
    for bad in ("-1", "soon", "inf", "nan"):
        with pytest.raises(ParamError, match=r"^stall_timeout must be a number of seconds >= 0 \(0: off\), got"):
            parse_stall_timeout(bad)


def test_more_params_is_parsed_as_words_never_by_a_shell() -> None:
    assert parse_more_params("") == {}
    assert parse_more_params("a=1 b='x y' c='$(touch /tmp/p)' e=$(id) d=\"q\\\"\"") == {
        "a": "1", "b": "x y", "c": "$(touch /tmp/p)", "e": "$(id)", "d": 'q"'}
    with pytest.raises(ParamError, match="more_params"):
        parse_more_params("a='unclosed")
    with pytest.raises(ParamError, match="more_params.*NAME=VALUE"):
        parse_more_params("justaword")


def test_more_params_reach_the_run(alpaca) -> None:  # type: ignore[no-untyped-def]
    env = form(data="x")
    del env["HIGGSFIELD_PARAM_on"]
    env["HIGGSFIELD_MORE_PARAMS"] = "on=yes"
    got = run_inputs(alpaca, env, 2)
    assert got.typed["on"] is True and got.not_passed == ()
    env["HIGGSFIELD_MORE_PARAMS"] = "lr=1"
    with pytest.raises(ParamError, match="'lr', which has its own field"):
        run_inputs(alpaca, env, 2)


def test_kill_target() -> None:
    assert kill_target("alpaca", {}) == "alpaca"
    assert kill_target(None, {"HIGGSFIELD_KILL_TARGET": " alpaca-20250101-1200-ab12 "}) == "alpaca-20250101-1200-ab12"
    for bad in ("", "  ", "a b", "$(id)", "-rf", "x;y"):
        with pytest.raises(ParamError):
            kill_target(bad, {})


def test_ci_config_uses_the_job_key_and_committed_known_hosts(project: Path, tmp_path: Path) -> None:
    cfg = load_config(project / "higgsfield.yml")
    key = tmp_path / "key"
    with pytest.raises(ConfigError, match="HIGGSFIELD_SSH_KEY_FILE is not set"):
        ci_config(cfg, {})
    key.write_text("\n")
    key.chmod(0o600)
    with pytest.raises(ConfigError, match="SSH_KEY secret is empty or not set"):
        ci_config(cfg, {"HIGGSFIELD_SSH_KEY_FILE": str(key)})
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    key.chmod(0o644)
    with pytest.raises(ConfigError, match="mode 0600"):
        ci_config(cfg, {"HIGGSFIELD_SSH_KEY_FILE": str(key)})
    key.chmod(0o600)
    with pytest.raises(ConfigError, match=r"\.higgsfield/known_hosts is not in the repository"):
        ci_config(cfg, {"HIGGSFIELD_SSH_KEY_FILE": str(key)})
    (project / ".higgsfield").mkdir()
    (project / ".higgsfield" / "known_hosts").write_text("gpu-1.example.com ssh-ed25519 AAAA\n")
    out = ci_config(cfg, {"HIGGSFIELD_SSH_KEY_FILE": str(key)})
    assert out.ssh.identity_file == str(key) and all(n.identity_file is None for n in out.nodes)
    assert out.path == cfg.path and cfg.ssh.identity_file is None     # the loaded config is not changed
    assert [out.node_identity(n) for n in out.nodes] == [str(key), str(key)]


def test_ci_config_with_only_local_nodes_needs_no_key(tmp_path: Path) -> None:
    proj = make_project(tmp_path / "p", config="name: solo\nnodes:\n  - host: localhost\n")
    cfg = load_config(proj / "higgsfield.yml")
    assert ci_config(cfg, dict(os.environ)) is cfg

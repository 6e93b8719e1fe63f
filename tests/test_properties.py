"""Properties over every string a user can give: configs, params, names and the workflow renderer.

- Whatever text lands in a param's default, options or description, or in a config field
  that reaches a workflow, the rendered YAML parses, carries the text back unchanged (or
  the input is refused in one line), and no ``run:`` script holds ``${{``.
- A random config (structured from the schema's keys, random text, random bytes) either
  loads or is refused with one ConfigError line: never another exception, never a hang.
- Params coerce or refuse in one line; names are matched in full.

Hypothesis runs derandomized with no example database, so CI sees the same examples on
every run and cannot flake; example counts are small enough for a loaded 2-core box, and
``deadline=None`` because a slow shared machine is not a bug (pytest-timeout bounds each
test). tests/fuzz/fuzz_inputs.py runs the same checks for minutes.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from higgsfield.contract.errors import ConfigError, ExperimentError, HiggsfieldError, ParamError
from higgsfield.contract.names import check_host, check_identifier, check_secret_name, is_run_name
from higgsfield.contract.params import ParamSpec, parse_assignments
from higgsfield.control.config import Config, parse_config
from higgsfield.control.project.discovery import DiscoveredExperiment
from higgsfield.control.workflows import render_workflows
from higgsfield.control.workflows.ci_inputs import parse_more_params
from higgsfield.control.workflows.render import PINNED_ACTIONS

FAST = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

#: Pieces that have broken YAML, shells, GitHub expressions or terminals somewhere.
NASTY = ["${{ secrets.SSH_KEY }}", "${{", "}}", '"; rm -rf ~ #', "$(id)", "`id`", "\n", "\r\n", "\x00", "\t",
         "\u2028", "\x85", "\ufeff", "\x1b[31m", "\udcff", "'", '"', "\\", ": ", " #", "- ", "? ", "&a", "*a",
         "!!python/object:os.system", "yes", "no", "on", "null", "~", "1e3", "0x10", "-", "--", "{", "[", "%",
         "@", "|", ">", "\u00e9", "\U0001f600", " ", "::error::x", "=", "a"]
TEXT = st.one_of(
    st.text(st.characters(exclude_categories=[]), max_size=40),                 # any code point, surrogates too
    st.lists(st.sampled_from(NASTY), max_size=6).map("".join),
    st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=5)), max_size=5).map("".join),
)
IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)


def _workflow(text: str) -> dict[str, Any]:
    data = yaml.safe_load(text)
    if True in data:            # YAML 1.1 reads the key `on` as True
        data["on"] = data.pop(True)
    assert isinstance(data, dict)
    return data


def _check_workflows(files: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Every file parses; no run: script holds an expression; every action is pinned."""
    out = {}
    for name, text in files.items():
        wf = _workflow(text)
        for job in wf["jobs"].values():
            for step in job.get("steps", []):
                assert "${{" not in step.get("run", ""), (name, step)
                if "uses" in step:
                    action, _, sha = step["uses"].partition("@")
                    assert PINNED_ACTIONS[action][0] == sha
        out[name] = wf
    return out


def _config(**extra: Any) -> Config:
    cfg = Config.model_validate({"name": "demo", "nodes": [{"host": "gpu-1.example.com"}], **extra})
    cfg.path = Path("/proj/higgsfield.yml")
    return cfg


def _experiment(name: str, params: list[ParamSpec]) -> DiscoveredExperiment:
    return DiscoveredExperiment(name=name, params=tuple(params), seed=None, file=Path("/proj/src/train.py"),
                                module="train", function="train", line=3)


# -- the workflow renderer ------------------------------------------------------------

@FAST
@given(text=TEXT, other=TEXT, pname=IDENT, exp=IDENT)
def test_any_param_text_round_trips_through_the_run_form(text: str, other: str, pname: str, exp: str) -> None:
    try:
        check_identifier(pname)
        check_identifier(exp)
        specs = [ParamSpec.build(pname, default=text, description=text),
                 ParamSpec.build(pname + "_o", options=[text, other + "x"] if text != other + "x" else [text]),
                 ParamSpec.build(pname + "_d", default=1.5, description=other)]
    except (ValueError, ParamError) as e:
        assert "\n" not in str(e)
        return
    try:
        files = render_workflows(_config(), [_experiment(exp, specs)])
    except ExperimentError as e:        # an expression in a value the form would send back: refused
        assert "${{" in text + other and "\n" not in str(e)
        return
    wf = _check_workflows(files)[f"run_{exp}.yml"]
    inputs = wf["on"]["workflow_dispatch"]["inputs"]
    expected_description = text.strip().replace("${{", "$ {{") or "str parameter"
    assert inputs[pname]["description"] == expected_description
    assert inputs[pname]["default"] == text
    assert inputs[pname + "_o"]["options"] == [str(o) for o in specs[1].options or ()]
    assert inputs[pname + "_d"]["description"] == (other.strip().replace("${{", "$ {{") or "float parameter")
    launch = next(s for s in wf["jobs"]["run"]["steps"] if s.get("run", "").startswith("higgsfield ci run"))
    assert launch["env"][f"HIGGSFIELD_PARAM_{pname}"] == "${{ inputs." + pname + " }}"


PLAUSIBLE = st.from_regex(r"[A-Za-z0-9._/+=:@~-]{1,30}", fullmatch=True)
ROUND_TRIP_FIELDS = {   # field -> (where in higgsfield.yml, how it reads back from the loaded config)
    "install.source": (lambda v: {"install": {"source": v}}, lambda c: c.install.source),
    "install.index_url": (lambda v: {"install": {"index_url": "https://" + v}}, lambda c: c.install.index_url[8:]),
    "default_branch": (lambda v: {"default_branch": v}, lambda c: c.default_branch),
    "ssh.known_hosts": (lambda v: {"ssh": {"known_hosts": v}}, lambda c: c.ssh.known_hosts),
}


@settings(FAST, max_examples=100)
@given(field=st.sampled_from(sorted(ROUND_TRIP_FIELDS)), value=st.one_of(TEXT, PLAUSIBLE),
       secret=st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True))
def test_any_config_text_that_loads_round_trips_into_the_workflows(field: str, value: str, secret: str) -> None:
    put, get = ROUND_TRIP_FIELDS[field]
    data = {"name": "demo", "nodes": [{"host": "gpu-1"}], "secrets": [secret], **put(value)}
    try:
        text = yaml.safe_dump(data, allow_unicode=True)
    except yaml.YAMLError:
        return   # PyYAML cannot write it (a lone surrogate): no file holds it either
    try:
        cfg = parse_config(text, Path("/proj/higgsfield.yml"))
    except ConfigError as e:
        assert "\n" not in str(e) and len(str(e)) < 600
        return
    assert get(cfg) == value and cfg.secrets == [secret]
    wf = _check_workflows(render_workflows(cfg, [_experiment("alpaca", [])]))
    install = next(s for s in wf["deploy.yml"]["jobs"]["deploy"]["steps"] if s.get("name") == "Install higgsfield")
    assert install["env"]["HIGGSFIELD_INSTALL"] == cfg.install.source
    assert install["env"].get("PIP_EXTRA_INDEX_URL") == cfg.install.index_url
    assert wf["deploy.yml"]["on"]["push"]["branches"] == [cfg.default_branch]
    launch = next(s for s in wf["run_alpaca.yml"]["jobs"]["run"]["steps"] if s.get("run", "").startswith("higgsfield"))
    assert launch["env"][secret] == "${{ secrets." + secret + " }}"


# -- configs: loads, or one ConfigError line ---------------------------------------------

SCALAR = st.one_of(TEXT, st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.booleans(), st.none())
VALUE = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.one_of(TEXT, st.integers()), inner,
                                                                     max_size=3)), max_leaves=8)
NODE_KEYS = ["host", "name", "port", "user", "identity_file", "nproc_per_node"]
TOP_KEYS = ["name", "nodes", "ssh", "nproc_per_node", "runtime", "secrets", "state_dir", "docker", "install",
            "default_branch"]
HOSTS = st.sampled_from(["gpu-1", "GPU-1", "10.0.0.2", "::1", "localhost", "local", "h.example.com", "a;b", "-o"])
NODE = st.one_of(
    st.fixed_dictionaries({"host": st.one_of(HOSTS, TEXT)},
                          optional={"port": st.one_of(st.integers(0, 70000), VALUE), "name": st.one_of(IDENT, TEXT),
                                    "user": st.one_of(IDENT, TEXT, st.just("root")),
                                    "nproc_per_node": st.one_of(st.integers(0, 8), st.just("auto"), VALUE),
                                    "identity_file": st.one_of(PLAUSIBLE, TEXT)}),
    st.dictionaries(st.one_of(st.sampled_from(NODE_KEYS), TEXT), VALUE, max_size=4))
PLAUSIBLE_TOP = {
    "ssh": st.fixed_dictionaries({}, optional={"user": IDENT, "port": st.integers(0, 70000),
                                               "known_hosts": PLAUSIBLE, "connect_timeout": st.floats(-1, 100),
                                               "retries": st.integers(-1, 20)}),
    "nproc_per_node": st.one_of(st.integers(0, 8), st.just("auto")),
    "runtime": st.sampled_from(["auto", "docker", "process", "k8s"]),
    "secrets": st.lists(st.one_of(st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True),
                                  st.sampled_from(["PATH", "GITHUB_TOKEN", "HIGGSFIELD_X", "A\n"])), max_size=3),
    "state_dir": st.one_of(PLAUSIBLE, st.sampled_from(["", "/", "~", "~/x", "../x"])),
    "docker": st.fixed_dictionaries({}, optional={"dockerfile": PLAUSIBLE, "base_image": PLAUSIBLE}),
    "install": st.fixed_dictionaries({}, optional={"source": PLAUSIBLE, "index_url": PLAUSIBLE}),
    "default_branch": PLAUSIBLE,
}
CONFIG = st.fixed_dictionaries(
    {"name": st.one_of(st.just("demo"), IDENT, VALUE),
     "nodes": st.one_of(st.lists(NODE, min_size=1, max_size=3), VALUE)},
    optional={k: st.one_of(PLAUSIBLE_TOP[k], VALUE) for k in TOP_KEYS[2:]})


def _loads_or_one_line(text: str) -> Config | None:
    try:
        cfg = parse_config(text, Path("/proj/higgsfield.yml"))
    except ConfigError as e:
        message = str(e)
        assert message.startswith("/proj/higgsfield.yml") and "\n" not in message and len(message) < 600, message
        return None
    for node in cfg.nodes:   # what the node list promises once loaded
        assert node.name and (node.is_local or check_host(node.host) == node.host)
    return cfg


@settings(FAST, max_examples=150)
@given(data=CONFIG)
def test_a_random_structured_config_loads_or_is_one_line(data: dict[str, Any]) -> None:
    try:
        text = yaml.safe_dump(data, allow_unicode=True)
    except yaml.YAMLError:
        return   # PyYAML cannot write it (a surrogate): no file holds it either
    cfg = _loads_or_one_line(text)
    if cfg is not None:
        _check_workflows(render_workflows(cfg, []))


@FAST
@given(text=st.one_of(TEXT, TEXT.map(lambda t: "name: a\nnodes: [{host: h}]\n" + t), st.lists(st.sampled_from(["name: a\n", "nodes:\n", "  - host: h\n", "- ", "&a ", "*a ",
                                                      "<<: ", "{", "[", "]", "}", ": ", "\n", "!!binary ", "'",
                                                      "\"", "? ", "---\n", "%YAML 1.1\n", "\t", "#"]),
                                max_size=30).map("".join)))
def test_random_text_loads_or_is_one_line(text: str) -> None:
    _loads_or_one_line(text)


@FAST
@given(data=st.binary(max_size=200))
def test_random_bytes_load_or_are_one_line(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    from higgsfield.control.config import load_config

    path = tmp_path_factory.mktemp("cfg") / "higgsfield.yml"
    path.write_bytes(b"name: a\nnodes: [{host: h}]\n# " + data)
    try:
        load_config(path)
    except ConfigError as e:
        assert "\n" not in str(e) and len(str(e)) < 600


# -- params and names -----------------------------------------------------------------

@FAST
@given(value=st.one_of(TEXT, st.integers(), st.floats(), st.booleans()), kind=st.sampled_from(["int", "float",
                                                                                              "str", "bool"]))
def test_a_param_value_coerces_or_is_one_line(value: object, kind: str) -> None:
    spec = ParamSpec("p", type=kind)
    try:
        out = spec.coerce(value)
    except ParamError as e:
        assert str(e).startswith("param 'p': ") and "\n" not in str(e) and len(str(e)) < 300
        return
    assert type(out).__name__ == kind
    if kind == "str" and isinstance(value, str):
        assert out == value


@FAST
@given(pairs=st.dictionaries(IDENT, TEXT.filter(lambda v: "\x00" not in v), max_size=5))
def test_more_params_and_param_pairs_round_trip(pairs: dict[str, str]) -> None:
    assert parse_assignments([f"{k}={v}" for k, v in pairs.items()]) == pairs
    assert parse_more_params(" ".join(shlex.quote(f"{k}={v}") for k, v in pairs.items())) == pairs


@FAST
@given(name=st.one_of(TEXT, IDENT, IDENT.map(lambda s: s + "\n")))
def test_names_are_matched_in_full(name: str) -> None:
    for check in (check_identifier, check_secret_name, check_host):
        try:
            out = check(name)
        except ValueError as e:
            assert "\n" not in str(e) and len(str(e)) < 400
        else:
            assert out == name and not any(c.isspace() or not c.isprintable() for c in name), (check, name)
    if is_run_name(name):
        assert name.isascii() and "\n" not in name and "/" not in name and not name.startswith(("-", "."))


def test_the_hypothesis_settings_are_deterministic() -> None:
    # A derandomized run with no database draws the same examples every time: CI cannot flake.
    assert FAST.derandomize and FAST.database is None and FAST.max_examples <= 100


def test_higgsfield_error_is_the_only_refusal() -> None:
    # The property tests above accept these, and only these, as a refusal.
    assert issubclass(ConfigError, HiggsfieldError) and issubclass(ParamError, HiggsfieldError)

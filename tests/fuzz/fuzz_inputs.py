"""Fuzz every input a user gives higgsfield, for minutes: no traceback, no hang, no broken YAML.

Run it (one process, niced, as the issue asks)::

    nice -n 10 .venv/bin/python tests/fuzz/fuzz_inputs.py --minutes 10

Each target draws inputs from hypothesis strategies (the ones tests/test_properties.py
uses, with bigger sizes), in rounds with a fresh seed each, until the time is up:

    config      higgsfield.yml as structure, text and bytes -> Config, or one ConfigError line
    env         env files as bytes -> a dict, or one ConfigError line
    source      experiment files under src/ (decorators, literals, junk, deep expressions, file
                names) -> experiments, or one ExperimentError line; found ones render to YAML
                that parses and carries every default, option and description back
    params      @param declarations and values -> a ParamSpec and typed values, or one line
    cli         argv for init, config, experiments, build-experiments, run, logs, kill and ci
                (with form values in the environment), in-process through main(): exit 0, 2,
                or "reached the nodes" (the backend's session, stubbed), with stderr one line; never
                "internal error"

and everything that comes back from a node or a run (issue 22):

    records     damaged run directories (wrong fields, any JSON, bytes, cut files, symlinks out,
                odd names, huge error tails) beside a healthy run -> the node's ``invoker status``
                shows the healthy run and one line per skip; any status reply decodes on the
                control side into typed views, or one line
    output      a rank's output in any bytes and chunking -> the same lines whatever the chunking,
                every line, none over the cap and its marker, nothing a terminal would obey
    metrics     good steps among lines of any shape -> ``invoker metrics`` shows every good step in
                order, and each other non-blank line is counted as skipped
    http        any request line, headers and body to a real ``higgsfield ui`` of a project with
                nothing to start or stop -> never a 5xx, never a redirect off its own root, always
                an answer

Any other exception, a multi-line or over-long message, an input taking over 20 s (a
hang), unparseable YAML or a ``${{`` in a ``run:`` script is a finding: printed with the
falsifying example, written to --out, and the exit code is 1. The last line is the summary:
``fuzz: N inputs in M s (per target ...), F findings``.

Not collected by pytest (the file name has no test_ prefix); tests/fuzz/test_fuzz_smoke.py
runs every target for a few examples so the driver cannot rot.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))   # tests/: the shared strategies and checks

import yaml  # noqa: E402
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_properties import (  # noqa: E402
    CONFIG,
    IDENT,
    NASTY,
    PLAUSIBLE,
    _check_workflows,
    _loads_or_one_line,
)

from higgsfield.contract.errors import ConfigError, ExperimentError, HiggsfieldError, ParamError  # noqa: E402
from higgsfield.contract.params import ParamSpec  # noqa: E402
from higgsfield.control.backends.nodes.backend import NodesBackend  # noqa: E402
from higgsfield.control.cli import main as cli_main  # noqa: E402
from higgsfield.control.config import Config, load_config  # noqa: E402
from higgsfield.control.project.discovery import discover  # noqa: E402
from higgsfield.control.secrets import load_env_file  # noqa: E402
from higgsfield.control.workflows import render_workflows  # noqa: E402

#: Seconds one input may take before it counts as a hang.
HANG_S = 20.0
COUNTS: Counter[str] = Counter()
#: How inputs ended, per target ("config refused", "cli exit 2", ...): shows the fuzz reaches past the checks.
OUTCOMES: Counter[str] = Counter()

BIG_TEXT = st.one_of(
    st.text(st.characters(exclude_categories=[]), max_size=200),
    st.lists(st.sampled_from(NASTY), max_size=20).map("".join),
    st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=8), PLAUSIBLE), max_size=8).map("".join),
    st.integers(0, 50_000).map(lambda n: "x" * n),                 # long values: cut in messages?
)


class Hang(BaseException):
    """An input ran past HANG_S (BaseException, so no ``except Exception`` in the code swallows it)."""


@contextlib.contextmanager
def bounded(what: str) -> Iterator[None]:
    def alarm(signum: int, frame: object) -> None:
        raise Hang(f"{what}: over {HANG_S:.0f} s on one input")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def one_line(message: str, limit: int = 600) -> None:
    assert "\n" not in message and "\r" not in message, f"a message of several lines: {message[:300]!r}"
    assert len(message) < limit, f"a message of {len(message)} chars: {message[:200]!r}"


# -- config -----------------------------------------------------------------------

RAW_YAML = st.lists(st.sampled_from(["name: a\n", "nodes:\n", "  - host: h\n", "- ", "&a ", "*a ", "<<: ", "{", "[",
                                     "]", "}", ": ", "\n", "!!binary ", "!!timestamp ", "!!float ", "!!set ", "'",
                                     '"', "? ", "---\n", "...\n", "%YAML 1.1\n", "%TAG ! !x\n", "\t", "#", "\\u0000",
                                     "\\x85", "9" * 5000, "[" * 500, "&a [*a, *a]\n", "state_dir: ", "port: "]),
                   max_size=60).map("".join)


@given(data=CONFIG, text=st.one_of(BIG_TEXT, RAW_YAML), raw=st.binary(max_size=400),
       mode=st.sampled_from(["structured", "text", "bytes", "prefixed"]))
def fuzz_config(data: dict[str, Any], text: str, raw: bytes, mode: str) -> None:
    COUNTS["config"] += 1
    with bounded("config"):
        if mode == "structured":
            try:
                text = yaml.safe_dump(data, allow_unicode=True)
            except yaml.YAMLError:
                return
        elif mode == "prefixed":
            text = "name: a\nnodes: [{host: h}]\n" + text
        if mode == "bytes":
            path = WORK / "cfg" / "higgsfield.yml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(raw if raw[:1] != b"n" else b"name: a\nnodes: [{host: h}]\n" + raw)
            try:
                cfg: Config | None = load_config(path)
            except ConfigError as e:
                one_line(str(e))
                cfg = None
        else:
            cfg = _loads_or_one_line(text)
        OUTCOMES["config " + ("loaded" if cfg is not None else "refused")] += 1
        if cfg is not None:
            _check_workflows(render_workflows(cfg, []))


# -- env files --------------------------------------------------------------------

@given(raw=st.one_of(st.binary(max_size=300), BIG_TEXT.map(lambda t: t.encode("utf-8", "surrogatepass"))))
def fuzz_env(raw: bytes) -> None:
    COUNTS["env"] += 1
    path = WORK / "env"
    path.write_bytes(raw)
    with bounded("env"):
        try:
            out = load_env_file(path)
        except ConfigError as e:
            one_line(str(e))
            return
        assert all(isinstance(k, str) and isinstance(v, str) and "\n" not in v for k, v in out.items())


# -- experiment sources ------------------------------------------------------------

LITERAL = st.one_of(BIG_TEXT, st.integers(-(2**80), 2**80), st.floats(), st.booleans(), st.none(),
                    st.lists(st.one_of(st.text(max_size=5), st.integers(), st.floats(), st.booleans()), max_size=4))
EXPRESSION = st.one_of(
    LITERAL.map(repr),
    st.sampled_from(["f(x)", "1+2", "int", "str", "bool", "float", "[1]", "{}", "x.y", "2**70", "-1", "...",
                     "lambda: 0", "*a", "**k", "(1,)", "b'x'", "1j", "None", "True"]),
    st.integers(1, 200_000).map(lambda n: "-" * n + "1"),            # too deep for ast
    st.integers(1, 400).map(lambda n: "(" * n + "1" + ")" * n),
    st.integers(1, 50_000).map(lambda n: "a" + ".b" * n),
    st.integers(1, 20_000).map(lambda n: "[" + "1, " * n + "]"),
)
ARGS = st.lists(st.one_of(EXPRESSION, st.tuples(st.sampled_from(["name", "default", "description", "required",
                                                                 "type", "options", "seed", "x", "name"]),
                                                EXPRESSION).map(lambda kv: f"{kv[0]}={kv[1]}")), max_size=5)
IMPORTS = st.sampled_from(["from higgsfield.experiment import experiment, param",
                           "from higgsfield.experiment import experiment as experiment, param as param",
                           "import higgsfield.experiment as hx\nexperiment, param = hx.experiment, hx.param",
                           "import higgsfield"])
FILE_NAMES = st.one_of(IDENT.map(lambda s: s + ".py"),
                       st.sampled_from(["train.v2.py", "my-exp.py", "2train.py", "class.py", "__init__.py",
                                        "pkg/train.py", "my-pkg/train.py", "a b.py", "é.py"]),
                       st.text(st.characters(exclude_characters="/\x00"), min_size=1, max_size=30).map(
                           lambda s: s + ".py"))


GOOD_PARAM = st.builds(
    lambda name, default, description, options: ", ".join(
        [repr(name)] + ([f"default={(options[0] if options else default)!r}"] if default is not None
                        else ["required=True", "type=str"])
        + [f"description={description!r}"] + ([f"options={options!r}"] if options else [])),
    st.none(), st.one_of(st.none(), BIG_TEXT, st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                         st.booleans()),
    BIG_TEXT, st.one_of(st.none(), st.lists(st.text(max_size=8), min_size=1, max_size=3, unique=True)))


@st.composite
def sources(draw: st.DrawFn) -> dict[str, str]:
    """Python files: about half well formed (so experiments are found and rendered), the rest anything."""
    files = {}
    all_good = draw(st.booleans())
    for f in range(draw(st.integers(1, 3))):
        good = all_good or draw(st.booleans())
        lines = ["from higgsfield.experiment import experiment, param" if good else draw(IMPORTS), ""]
        for e in range(draw(st.integers(0, 3))):
            if good:   # unique names: a clash is a (tested) refusal, not what this half is for
                decorators = [f"@experiment('e{f}_{e}_{draw(IDENT)}')"]
                decorators += [f"@param({draw(GOOD_PARAM).replace('None', repr(f'p{p}_{draw(IDENT)}'), 1)})"
                               for p in range(draw(st.integers(0, 4)))]
            else:
                decorators = [f"@experiment({', '.join(draw(ARGS))})"] if draw(st.booleans()) else []
                decorators += [f"@param({', '.join(draw(ARGS))})" for _ in range(draw(st.integers(0, 4)))]
            if draw(st.booleans()):
                decorators = draw(st.permutations(decorators))
            signature = "params" if good else draw(st.sampled_from(["params", "", "a, b", "*a"]))
            lines += [*decorators, f"def {draw(IDENT)}({signature}):", "    pass", ""]
        if not good and draw(st.integers(0, 4)) == 0:
            lines.insert(draw(st.integers(0, len(lines))), draw(BIG_TEXT))   # junk: syntax errors
        name = f"m{f}_{draw(IDENT)}.py" if good else draw(FILE_NAMES)
        files[name] = "\n".join(lines)
    return files


@given(files=sources(), cfg_extra=st.sampled_from([{}, {"secrets": ["WANDB_API_KEY"]},
                                                    {"install": {"source": "git+https://x/y@v1"}}]))
def fuzz_source(files: dict[str, str], cfg_extra: dict[str, Any]) -> None:
    COUNTS["source"] += 1
    src = WORK / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir()
    for rel, text in files.items():
        path = src / rel
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8", errors="surrogateescape")
        except (OSError, UnicodeEncodeError):
            return   # a name or text no file system holds
    with bounded("source"):
        try:
            found = discover(src)
        except ExperimentError as e:
            one_line(str(e), 900)    # a path of up to 30 odd characters, then the message
            OUTCOMES["source refused"] += 1
            return
        OUTCOMES[f"source found {min(len(found), 2)}"] += 1
        cfg = Config.model_validate({"name": "demo", "nodes": [{"host": "gpu-1"}], **cfg_extra})
        cfg.path = WORK / "higgsfield.yml"
        try:
            rendered = render_workflows(cfg, found)
        except ExperimentError as e:
            one_line(str(e))
            return
        workflows = _check_workflows(rendered)
        for exp in found:
            inputs = workflows[f"run_{exp.name}.yml"]["on"]["workflow_dispatch"]["inputs"]
            for spec in exp.params:
                if spec.name not in inputs:
                    continue   # carried by more_params
                field = inputs[spec.name]
                assert field["description"] == (spec.description.strip() or f"{spec.type} parameter").replace(
                    "${{", "$ {{"), (spec, field)
                if spec.options is not None:
                    assert [spec.coerce(o) for o in field["options"]] == list(spec.options)
                elif spec.default is not None:
                    assert spec.coerce(field["default"]) == spec.default, (spec, field)


# -- params ------------------------------------------------------------------------

@given(name=st.one_of(IDENT, BIG_TEXT), default=LITERAL, description=st.one_of(BIG_TEXT, LITERAL),
       required=st.one_of(st.booleans(), LITERAL), kind=st.one_of(st.sampled_from(["int", "float", "str", "bool", int,
                                                                                    float, str, bool, None]), LITERAL),
       options=st.one_of(st.none(), LITERAL), values=st.lists(st.one_of(BIG_TEXT, LITERAL), max_size=4))
def fuzz_params(name: Any, default: Any, description: Any, required: Any, kind: Any, options: Any,
                values: list[Any]) -> None:
    COUNTS["params"] += 1
    with bounded("params"):
        try:
            spec = ParamSpec.build(name, default=default, description=description, required=required, type=kind,
                                   options=options)
        except ValueError as e:
            one_line(str(e))
            return
        for value in values:
            try:
                out = spec.coerce(value)
            except ParamError as e:
                one_line(str(e))
                continue
            assert type(out).__name__ == spec.type


# -- the CLI ------------------------------------------------------------------------

class Reached(HiggsfieldError):
    """The stubbed backend session was opened: every argument check passed."""

    exit_code = 3


def _reached(*args: object, **kwargs: object) -> Any:
    raise Reached("reached the nodes")


#: What the CLI calls to reach the nodes: ``run``, ``logs``, ``kill``, ``ci run`` and ``ci kill`` open the
#: backend's session (and start, follow or kill through it), so no fuzzed input ever gets further.
STUBS = [(NodesBackend, "session")]


PROJECT = "name: demo\nnodes:\n  - host: localhost\nruntime: process\nsecrets: [WANDB_API_KEY]\n"
EXPERIMENT = ('from higgsfield.experiment import experiment, param\n\n@experiment("alpaca")\n'
              '@param("steps", default=10)\n@param("tag", default="x")\n@param("fast", default=False)\n'
              '@param("size", default="7b", options=["7b", "13b"])\ndef train(params):\n    pass\n')
COMMANDS = [["config", "check"], ["config", "schema"], ["experiments"], ["experiments", "--json"],
            ["build-experiments", "--check"], ["build-experiments"], ["run"], ["logs"], ["kill"], ["init"],
            ["ci", "run"], ["ci", "kill"], ["ci", "deploy"], ["show-deploy-key"]]
ENV = ["HIGGSFIELD_PARAM_steps", "HIGGSFIELD_PARAM_tag", "HIGGSFIELD_PARAM_fast", "HIGGSFIELD_PARAM_size",
       "HIGGSFIELD_PARAM_nope", "HIGGSFIELD_MORE_PARAMS", "HIGGSFIELD_RUN_NAME", "HIGGSFIELD_NODES",
       "HIGGSFIELD_KILL_TARGET", "WANDB_API_KEY"]
WORD = st.one_of(st.sampled_from(["alpaca", "0", "-5", "1", "2", "steps=3", "tag=x", "size=70b", "0001-01-01", "1d",
                                  "a b", "../x", "x" * 100, "demo", "-rf"]), BIG_TEXT, IDENT,
                 st.integers(-(2**64), 2**64).map(str))


OPTION_VALUES = {   # option -> values a user might give: mostly plausible, some hostile
    "--nodes": st.one_of(st.sampled_from(["1", "2", "0", "-1", "x"]), WORD),
    "--max-restarts": st.one_of(st.sampled_from(["0", "3", "-5", "1001"]), WORD),
    "--run-name": st.one_of(st.sampled_from(["sweep-1", "a.b_c", "../x", "-x"]), WORD),
    "-p": st.one_of(st.sampled_from(["steps=3", "tag=x y", "fast=yes", "size=13b", "size=70b", "steps=1e3",
                                     "nope=1", "steps"]), WORD.map(lambda w: "tag=" + w), WORD),
    "--rank": st.one_of(st.sampled_from(["0", "1", "-1"]), WORD),
    "--since": st.one_of(st.sampled_from(["30s", "10m", "2h", "1d", "0001-01-01", "9999-12-31", "2026-11-30T10:00Z",
                                          "99999999999d", "soon"]), WORD),
    "--node": st.one_of(st.just("localhost"), WORD),
    "--src": st.one_of(st.just("src"), WORD), "--out": st.one_of(st.just("out"), WORD),
}
FLAGS = ["--follow", "--detach", "--exclusive", "--json", "--check", "--help", "--", "-x", "--bogus"]
ARGV = st.lists(st.one_of(st.sampled_from(sorted(OPTION_VALUES)).flatmap(
    lambda o: OPTION_VALUES[o].map(lambda v: [o, v])), st.sampled_from(FLAGS).map(lambda f: [f])),
    max_size=3).map(lambda groups: [w for g in groups for w in g])
POSITIONAL = st.one_of(st.sampled_from([[], ["alpaca"], ["alpaca"], ["demo"], ["alpaca-20260101-000000-abcd"]]),
                       st.lists(WORD, max_size=2))


@given(command=st.sampled_from(COMMANDS), positional=POSITIONAL, options=ARGV,
       env=st.dictionaries(st.sampled_from(ENV), st.one_of(BIG_TEXT, WORD, st.sampled_from(["", "1", "3", "x"])),
                           max_size=4),
       config=st.sampled_from([PROJECT, PROJECT.replace("localhost", "a;b"), "", "name: [\n"]))
def fuzz_cli(command: list[str], positional: list[str], options: list[str], env: dict[str, str],
             config: str) -> None:
    COUNTS["cli"] += 1
    argv = [*positional, *options]
    if "--out" in argv or "--src" in argv:   # keep every path the command may write inside the project
        argv = [a.replace("/", "_") for a in argv]
    args = [*command, *argv]
    if any("\x00" in a for a in [*args, *env.values()]):
        return   # no argv word or environment variable can hold a NUL
    project = WORK / "cli"
    shutil.rmtree(project, ignore_errors=True)
    (project / "src").mkdir(parents=True)
    (project / "higgsfield.yml").write_text(config)
    (project / "src" / "train.py").write_text(EXPERIMENT)
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    try:
        os.chdir(project)
        for k, v in env.items():
            try:
                os.environ[k] = v.encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape")
            except (UnicodeEncodeError, ValueError):
                return
        with bounded("cli"), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli_main(list(args))
            except SystemExit as e:
                code = e.code
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    stderr = err.getvalue()
    OUTCOMES[f"cli exit {code or 0}"] += 1
    assert "internal error" not in stderr and "Traceback" not in stderr, (args, stderr[-2000:])
    assert code in (0, None, 1, 2, 3), (args, code, stderr[-500:])
    if code not in (0, None):
        lines = [line for line in stderr.splitlines() if not line.startswith("::")]  # ci's GitHub annotation
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, stderr[-1000:])
        one_line(lines[0], 900)
        if code == 1:   # exit 1 is for what is not the user's input: a stale --check, a clash with a user file,
            # or `ci deploy` (which goes through the backend's deploy, not the stubbed session) in a project
            # that is no git checkout: the workflow's checkout always has a commit
            assert any(why in lines[0] for why in ("not up to date", "did not generate", "has no commit to deploy")), \
                (args, lines[0])


# -- what comes back from a node or a run ----------------------------------------------

JSON_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), BIG_TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
RECORD_KEYS = st.one_of(st.sampled_from(["project", "experiment", "run", "node", "node_rank", "nnodes", "nproc",
                                         "state", "runtime", "command", "pids", "pid_starts", "container", "slots",
                                         "exit_code", "reason", "created_at", "started_at", "ended_at", "failed_rank",
                                         "failed_node", "error_tail", "master_port", "coord_port", "attempt"]),
                        st.text(max_size=8))
DIR_NAME = st.one_of(IDENT, st.sampled_from(["..", ".", "-x", "a" * 300, "evil\x1b]0;t\x07", "x\u2028y", "run 1"]),
                     st.text(st.characters(exclude_characters="/\x00"), min_size=1, max_size=40))


def _healthy_record(run: str) -> dict[str, Any]:
    from higgsfield.contract.codec import encode
    from higgsfield.node.state.records import RunRecord

    record: dict[str, Any] = encode(RunRecord(project="fz", experiment="e", run=run, node="localhost", node_rank=0,
                                              nnodes=1, nproc=1, state="succeeded", exit_code=0, created_at=1.0,
                                              started_at=1.0, ended_at=2.0))
    return record


@st.composite
def damaged_run(draw: st.DrawFn) -> tuple[str, str, bytes | None]:
    """(directory name, shape, run.json bytes or None for a symlink): one run directory as a crash,
    a full disk or another tool might leave it."""
    shape = draw(st.sampled_from(["fields", "json", "bytes", "text", "truncated", "symlink", "huge tail"]))
    name = draw(st.one_of(st.just("broken"), DIR_NAME))
    record = _healthy_record(name if draw(st.booleans()) else draw(DIR_NAME))
    text = json.dumps(record)
    if shape == "fields":
        for key in draw(st.lists(RECORD_KEYS, min_size=1, max_size=4)):
            record[key] = draw(JSON_VALUE)
        return name, shape, json.dumps(record).encode()
    if shape == "json":
        return name, shape, json.dumps(draw(JSON_VALUE)).encode()
    if shape == "bytes":
        return name, shape, draw(st.binary(max_size=600))
    if shape == "text":
        return name, shape, draw(BIG_TEXT).encode("utf-8", "surrogatepass")
    if shape == "truncated":
        return name, shape, text[: draw(st.integers(0, len(text)))].encode()
    if shape == "huge tail":
        record.update(state="failed", error_tail=draw(st.one_of(
            BIG_TEXT, st.integers(0, 300_000).map(lambda n: ["frame"] * n), JSON_VALUE)))
        return name, shape, json.dumps(record).encode()
    return name, shape, None


@given(damaged=st.lists(damaged_run(), min_size=1, max_size=3),
       reply=st.one_of(JSON_VALUE, st.fixed_dictionaries({"version": st.just(1), "runs": st.lists(
           st.one_of(JSON_VALUE, st.builds(_healthy_record, DIR_NAME)), max_size=3), "skipped": JSON_VALUE})))
def fuzz_records(damaged: list[tuple[str, str, bytes | None]], reply: Any) -> None:
    """Damaged run directories beside a healthy run: the node's ``status`` shows the healthy one and names
    each skip in one line; the control side decodes any reply into typed views or one line."""
    from higgsfield.contract.decode import DecodeError
    from higgsfield.contract.names import is_run_name
    from higgsfield.contract.noderuns import read_node_runs
    from higgsfield.contract.runspec import SpecError

    COUNTS["records"] += 1
    state = WORK / "state"
    shutil.rmtree(state, ignore_errors=True)
    runs = state / "runs" / "fz"
    (runs / "healthy" / "logs").mkdir(parents=True)
    (runs / "healthy" / "run.json").write_text(json.dumps(_healthy_record("healthy")))
    outside = WORK / "outside.json"
    outside.write_text(json.dumps(_healthy_record("outside")))
    for name, _shape, data in damaged:
        if name == "healthy":
            continue
        d = runs / name
        try:
            (d / "logs").mkdir(parents=True, exist_ok=True)
            if data is None:
                (d / "run.json").unlink(missing_ok=True)
                (d / "run.json").symlink_to(outside)
            else:
                (d / "run.json").write_bytes(data)
        except (OSError, UnicodeEncodeError):
            continue   # a name no file system holds
    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    with bounded("records"), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli_main(["invoker", "--state-dir", str(state), "status"])
        except SystemExit as e:
            code = e.code
    assert code in (0, None), (damaged, code, err.getvalue()[-1000:])
    reply_here = json.loads(out.getvalue())
    shown = {r["run"]: r for r in reply_here["runs"]}
    assert shown.get("healthy", {}).get("state") == "succeeded", (damaged, reply_here)
    assert "outside" not in shown, "a record reached through a symlink out of the state dir was shown"
    assert all(is_run_name(r) for r in shown), sorted(shown)
    for line in reply_here["skipped"]:
        one_line(line, 900)
    for r in shown.values():
        tail = r.get("error_tail") or []
        assert isinstance(tail, list) and len(tail) <= 50 and all(isinstance(x, str) for x in tail), tail[:3]
    OUTCOMES[f"records shown {min(len(shown), 3)}, skipped {min(len(reply_here['skipped']), 3)}"] += 1
    decoded = read_node_runs(reply_here)
    assert "healthy" in {v.run for v in decoded.runs}
    with bounded("records reply"):
        try:
            views = read_node_runs(reply)
        except (DecodeError, SpecError) as e:
            one_line(str(e), 900)
            OUTCOMES["records reply refused"] += 1
            return
        OUTCOMES["records reply decoded"] += 1
        for line in views.skipped:
            one_line(line, 900)


OUTPUT_PIECES = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([b"\x1b[31m", b"\x1b]0;title\x07", b"\r", b"\x08", b"\x00", b"\xff\xfe", b"\xe2\x80", b"\n",
                     b"\x9b", b"\x7f", b"\xed\xa0\x80", "é".encode(), "😀".encode()[:3]]),
    st.integers(0, 300_000).map(lambda n: b"x" * n),
)


@given(pieces=st.lists(OUTPUT_PIECES, max_size=12), chunk=st.integers(1, 70_000),
       max_line=st.sampled_from([64, 1024, 65536]))
def fuzz_output(pieces: list[bytes], chunk: int, max_line: int) -> None:
    """A rank's output in any bytes and chunking: every line comes out, none longer than the cap and its
    marker, the same whatever the chunking; shown on a terminal, no control byte is left to obey."""
    from higgsfield.contract.text import LineSplitter, inert

    COUNTS["output"] += 1
    data = b"".join(pieces)
    with bounded("output"):
        whole = LineSplitter(max_line)
        expect = whole.feed(data) + whole.end()
        split = LineSplitter(max_line)
        got: list[str] = []
        for i in range(0, len(data), chunk):
            got += split.feed(data[i:i + chunk])
        got += split.end()
    assert got == expect, "the lines depend on how the bytes were chunked"
    assert len(got) == data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1), (len(got), data[:80])
    for line in got:
        assert len(line) <= max_line + 40, len(line)   # a byte decodes to at most one character
        shown = inert(line)
        assert not any(ord(c) < 0x20 and c != "\t" or 0x7F <= ord(c) <= 0x9F for c in shown), repr(shown[:80])
    OUTCOMES[f"output lines {min(len(got), 3)}"] += 1


FINITE = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300)
GOOD_STEP = st.builds(
    lambda step, loss, tps, st_s, lr: json.dumps({"step": step, "loss": loss, "tokens_per_s": tps,
                                                  "step_time_s": st_s, "lr": lr, "time": 1.0}),
    st.integers(0, 2**53), FINITE, st.floats(0, 1e12), st.floats(0, 1e6), st.one_of(st.none(), FINITE))
BAD_LINE = st.one_of(
    JSON_VALUE.map(json.dumps),
    st.fixed_dictionaries({"step": JSON_VALUE, "loss": JSON_VALUE, "tokens_per_s": JSON_VALUE,
                           "step_time_s": JSON_VALUE}, optional={"lr": JSON_VALUE}).map(json.dumps),
    BIG_TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.binary(max_size=300),
    st.integers(60_000, 300_000).map(lambda n: '{"step": 1, "loss": "' + "x" * n + '"}'),
    st.integers(1, 100_000).map(lambda n: "[" * n),
)


@given(lines=st.lists(st.one_of(GOOD_STEP.map(lambda g: ("good", g)), BAD_LINE.map(lambda b: ("bad", b))),
                      max_size=12))
def fuzz_metrics(lines: list[tuple[str, str | bytes]]) -> None:
    """A run's metrics file with good steps among lines of any shape: the node's ``metrics`` shows every
    good step in order and counts the rest, so each non-blank line is either shown or counted."""
    from higgsfield.metrics import decode_line, parse_skipped
    from higgsfield.node.observe.metrics import metrics_path
    from higgsfield.node.state.home import NodeState
    from higgsfield.node.state.records import RunDir

    COUNTS["metrics"] += 1
    state = WORK / "mstate"
    shutil.rmtree(state, ignore_errors=True)
    rd = RunDir(NodeState(state), "fz", "healthy")
    rd.make()
    rd.record_path.write_text(json.dumps(_healthy_record("healthy")))
    raw = [b.encode() if isinstance(b, str) else b for _, b in lines]
    data = b"\n".join(raw) + (b"\n" if raw else b"")
    path = metrics_path(rd)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    nonblank = [x for x in data.split(b"\n") if x.strip()]   # blank: ASCII white space only, as the node reads
    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    with bounded("metrics"), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli_main(["invoker", "--state-dir", str(state), "metrics", "--project", "fz", "--run", "healthy"])
        except SystemExit as e:
            code = e.code
    assert code in (0, None), (code, err.getvalue()[-1000:])
    shown, skipped = [], 0
    for text in out.getvalue().splitlines():
        n = parse_skipped(text)
        if n is not None:
            skipped = n
        else:
            shown.append(decode_line(text))
    good = [decode_line(g) for kind, g in lines if kind == "good" and isinstance(g, str)]
    assert [m.step for m in shown if m in good] == [m.step for m in good], "a good step was lost"
    assert len(shown) + skipped == len(nonblank), (len(shown), skipped, len(nonblank))
    OUTCOMES[f"metrics skipped {min(skipped, 3)}"] += 1


_UI: dict[str, Any] = {}
HTTP_PATHS = st.one_of(
    st.sampled_from(["/", "/api/runs", "/api/nodes", "/api/events", "/api/runs/x", "/api/runs/x/kill",
                     "/api/runs/x/events", "/static/app.js", "/static/../higgsfield.yml", "//evil.example/",
                     "/%5Cevil.example/", "/\\evil.example/", "/?token=", "/%2e%2e/%2e%2e/etc/passwd"]),
    st.text(max_size=40).map(lambda t: "/" + t),
    st.binary(max_size=40).map(lambda b: "/" + b.decode("latin-1")),
)


@given(method=st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "G\u00c9T", "X" * 40]),
       path=HTTP_PATHS, query=st.one_of(st.just(""), st.sampled_from(["?token=", "?run=../x", "?a=1&" * 100]),
                                        st.text(max_size=30).map(lambda t: "?" + t)),
       auth=st.sampled_from(["none", "cookie", "cookie+csrf", "token"]),
       ctype=st.sampled_from([None, "application/json", "text/plain", "application/json; charset=latin-1",
                              "multipart/form-data; boundary=x", "\u2028"]),
       body=st.one_of(st.just(b""), JSON_VALUE.map(lambda v: json.dumps(v).encode()), st.binary(max_size=300),
                      st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n),
                      st.dictionaries(st.sampled_from(["experiment", "params", "run_name", "nodes", "x"]),
                                      JSON_VALUE, max_size=4).map(lambda v: json.dumps(v).encode())))
def fuzz_http(method: str, path: str, query: str, auth: str, ctype: str | None, body: bytes) -> None:
    """Any request a client can put on the wire, to a real ``higgsfield ui`` of a project with no
    experiments and no runs (nothing a request can start or stop): never a 5xx, never a redirect
    off the server's own root, and always an answer."""
    import http.client
    import socket

    from higgsfield.control.ui.security import cookie_name, csrf_token

    COUNTS["http"] += 1
    d = _dashboard()
    target = (path + query).encode("utf-8", "surrogateescape")
    if auth == "token":
        target += (b"&" if b"?" in target else b"?") + f"token={d.token}".encode()
    head = [method.encode("utf-8") + b" " + target.replace(b" ", b"%20").replace(b"\r", b"").replace(b"\n", b"")
            + b" HTTP/1.1", f"Host: 127.0.0.1:{d.port}".encode(), b"Connection: close",
            f"Content-Length: {len(body)}".encode()]
    if auth.startswith("cookie"):
        head.append(f"Cookie: {cookie_name(d.port)}={d.token}".encode())
    if auth == "cookie+csrf":
        head.append(f"X-HF-CSRF: {csrf_token(d.token)}".encode())
    if ctype is not None:
        head.append(b"Content-Type: " + ctype.encode("utf-8"))
    with bounded("http"), socket.create_connection(("127.0.0.1", d.port), timeout=HANG_S / 2) as sock:
        try:
            sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        except OSError:
            pass   # the server may answer and close before it has read a large body
        resp = http.client.HTTPResponse(sock, method=method)
        try:
            resp.begin()
        except http.client.RemoteDisconnected:
            OUTCOMES["http closed"] += 1   # uvicorn drops a request line it cannot parse
            return
        status = resp.status
        location = resp.getheader("Location")
    OUTCOMES[f"http {status // 100}xx"] += 1
    assert status < 500, (method, target[:200], status)
    if location is not None:
        assert location == "/" or (location.startswith("/") and not location.startswith(("//", "/\\"))), location


def _dashboard() -> Any:
    """The real dashboard the http target talks to: started on first use, stopped when :func:`run` ends."""
    if "d" not in _UI:
        sys.path.insert(0, str(HERE.parent / "ui"))
        from ui_helpers import dashboard

        proj = WORK / "ui-project"
        (proj / "src").mkdir(parents=True, exist_ok=True)
        (proj / "higgsfield.yml").write_text(f"name: fzui\nnodes:\n  - host: localhost\nruntime: process\n"
                                             f"state_dir: {WORK / 'ui-state'}\n")
        stack = contextlib.ExitStack()
        _UI["d"], _UI["stack"] = stack.enter_context(dashboard(proj)), stack
    return _UI["d"]


TARGETS: dict[str, Callable[[], None]] = {"config": fuzz_config, "env": fuzz_env, "source": fuzz_source,
                                          "params": fuzz_params, "cli": fuzz_cli, "records": fuzz_records,
                                          "output": fuzz_output, "metrics": fuzz_metrics, "http": fuzz_http}
WORK = Path(tempfile.gettempdir())   # replaced by a private directory in run()


def run(seconds: float, batch: int, out: Path | None, targets: list[str], first_seed: int = 0,
        rounds: int | None = None, quiet: bool = False) -> tuple[int, list[str]]:
    """Fuzz until ``seconds`` pass (or ``rounds`` rounds ran); returns (inputs tried, findings)."""
    global WORK
    stubs = {(owner, name): getattr(owner, name) for owner, name in STUBS}
    saved_home = os.environ.get("HIGGSFIELD_HOME_CONFIG")
    findings: list[str] = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hf-fuzz-") as tmp:
        WORK = Path(tmp)
        os.environ["HIGGSFIELD_HOME_CONFIG"] = str(WORK / "home")
        for owner, name in stubs:
            setattr(owner, name, _reached)
        try:
            round_no = first_seed
            while rounds is None or round_no < first_seed + rounds:
                for name in targets:
                    if time.monotonic() - start >= seconds:
                        return sum(COUNTS.values()), findings
                    fuzz = TARGETS[name]
                    fuzz._hypothesis_internal_use_settings = settings(   # type: ignore[attr-defined]
                        max_examples=batch, deadline=None, database=None, derandomize=False,
                        suppress_health_check=list(HealthCheck))
                    seed(round_no)(fuzz)   # a fresh seed each round: new inputs, the same on a re-run
                    try:
                        fuzz()
                    except (Exception, Hang) as e:   # hypothesis re-raises the shrunk example's error
                        text = "".join(traceback.format_exception(e))
                        findings.append(f"[{name}] seed {round_no}\n{text}")
                        print(f"FINDING in {name} (seed {round_no}):\n{text}", file=sys.stderr, flush=True)
                        if out:
                            out.mkdir(parents=True, exist_ok=True)
                            (out / f"finding-{len(findings)}-{name}.txt").write_text(findings[-1])
                if not quiet:
                    print(f"round {round_no}: {sum(COUNTS.values())} inputs in {time.monotonic() - start:.0f} s "
                          f"({dict(COUNTS)}), {len(findings)} findings", flush=True)
                round_no += 1
            return sum(COUNTS.values()), findings
        finally:
            if "stack" in _UI:
                _UI.pop("stack").close()
                _UI.clear()
            for (owner, name), fn in stubs.items():
                setattr(owner, name, fn)
            if saved_home is None:
                os.environ.pop("HIGGSFIELD_HOME_CONFIG", None)
            else:
                os.environ["HIGGSFIELD_HOME_CONFIG"] = saved_home


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=200, help="examples per target per round")
    parser.add_argument("--seed", type=int, default=0, help="the first round's seed")
    parser.add_argument("--only", action="append", choices=sorted(TARGETS), help="only this target (repeatable)")
    parser.add_argument("--out", type=Path, default=None, help="write each finding to a file here")
    args = parser.parse_args()
    t0 = time.monotonic()
    total, findings = run(args.minutes * 60, args.batch, args.out, args.only or list(TARGETS), args.seed)
    spent = time.monotonic() - t0
    per = ", ".join(f"{k} {v}" for k, v in sorted(COUNTS.items()))
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(OUTCOMES.items())), flush=True)
    print(f"fuzz: {total} inputs in {spent:.0f} s ({per}), {len(findings)} findings", flush=True)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())

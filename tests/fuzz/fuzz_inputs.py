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
                or "reached the orchestrator" (stubbed), with stderr one line; never
                "internal error"

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

import higgsfield.orchestrator as orchestrator  # noqa: E402
from higgsfield.cli import main as cli_main  # noqa: E402
from higgsfield.config import Config, load_config  # noqa: E402
from higgsfield.discovery import discover  # noqa: E402
from higgsfield.errors import ConfigError, ExperimentError, HiggsfieldError, ParamError  # noqa: E402
from higgsfield.params import ParamSpec  # noqa: E402
from higgsfield.secrets import load_env_file  # noqa: E402
from higgsfield.workflows import render_workflows  # noqa: E402

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
    """The stubbed orchestrator was called: every argument check passed."""

    exit_code = 3


def _reached(*args: object, **kwargs: object) -> Any:
    raise Reached("reached the orchestrator")


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
        if code == 1:   # exit 1 is for what is not the user's input: a stale --check, a clash with a user file
            assert "not up to date" in lines[0] or "did not generate" in lines[0], (args, lines[0])


TARGETS: dict[str, Callable[[], None]] = {"config": fuzz_config, "env": fuzz_env, "source": fuzz_source,
                                          "params": fuzz_params, "cli": fuzz_cli}
WORK = Path(tempfile.gettempdir())   # replaced by a private directory in run()


def run(seconds: float, batch: int, out: Path | None, targets: list[str], first_seed: int = 0,
        rounds: int | None = None, quiet: bool = False) -> tuple[int, list[str]]:
    """Fuzz until ``seconds`` pass (or ``rounds`` rounds ran); returns (inputs tried, findings)."""
    global WORK
    stubs = {name: getattr(orchestrator, name) for name in ("start_run", "plan_run", "connect", "get_run", "kill",
                                                             "deploy")}
    saved_home = os.environ.get("HIGGSFIELD_HOME_CONFIG")
    findings: list[str] = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hf-fuzz-") as tmp:
        WORK = Path(tmp)
        os.environ["HIGGSFIELD_HOME_CONFIG"] = str(WORK / "home")
        for name in stubs:
            setattr(orchestrator, name, _reached)
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
            for name, fn in stubs.items():
                setattr(orchestrator, name, fn)
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

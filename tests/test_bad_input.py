"""Every kind of bad input is refused in one line, exit 2, with nothing written and no traceback.

The catalogue covers what issue 10's hidden set tried: higgsfield.yml (bytes, YAML tricks,
hosts, names, secrets, paths), the env file, experiment sources, CLI arguments and the
inputs of ``higgsfield ci``. Each case runs the CLI's ``main()`` in-process (the path a user
gets, without an interpreter start per case); a few run the real ``python -m higgsfield``
in a subprocess. The property and fuzz tests (tests/test_properties.py, tests/fuzz/) try
random inputs; this file pins the named ones and their messages.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers_project import run_cli

from higgsfield.control.backends.nodes import backend as nodes_backend
from higgsfield.control.backends.nodes.session import NodesSession
from higgsfield.control.cli import main
from higgsfield.control.cli._lines import parse_since

NODE = "name: demo\nnodes:\n  - host: gpu-1.example.com\n"
LOCAL = "name: demo\nnodes:\n  - host: localhost\nruntime: process\n"
EXPERIMENT = ('from higgsfield.experiment import experiment, param\n\n'
              '@experiment("alpaca")\n@param("steps", default=10)\n@param("tag", default="x")\n'
              'def train(params):\n    pass\n')


def forbid_start_and_kill(monkeypatch: pytest.MonkeyPatch) -> None:
    """A start or a kill fails the test: ``run``, ``kill``, ``ci run`` and ``ci kill`` open the backend's
    session (:class:`NodesBackend`, its connection faked here: no node is contacted) and call its ``start``
    or ``kill``, so bad input that ever got that far would be caught here."""
    @contextlib.asynccontextmanager
    async def no_connection(cfg: object, nodes: object = None) -> AsyncIterator[None]:
        yield None

    monkeypatch.setattr(nodes_backend, "connect", no_connection)
    monkeypatch.setattr(NodesSession, "start", lambda *a, **k: pytest.fail("launched"))
    monkeypatch.setattr(NodesSession, "kill", lambda *a, **k: pytest.fail("killed"))


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI in-process; assert one ``error:`` line on stderr and exit 2; return the line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(argv)
    out = capsys.readouterr()
    assert info.value.code == 2, (info.value.code, out.err)
    assert out.err.startswith("error: ") and out.err.endswith("\n") and out.err.count("\n") == 1, out.err
    assert "Traceback" not in out.err and "internal error" not in out.err
    assert len(out.err) < 600, f"{len(out.err)} chars: values quoted in errors must be cut"
    return out.err


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty project directory as the working directory, no HIGGSFIELD_* in the environment."""
    for k in list(os.environ):
        if k.startswith(("HIGGSFIELD_", "GITHUB_")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HIGGSFIELD_HOME_CONFIG", str(tmp_path / "home"))
    root = tmp_path / "proj"
    (root / "src").mkdir(parents=True)
    monkeypatch.chdir(root)
    return root


# -- higgsfield.yml -------------------------------------------------------------

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(9)) + NODE
MERGE_BOMB = "m0: &m0 {k: 1}\n" + "".join(f"m{i + 1}: &m{i + 1} {{<<: [*m{i}, *m{i}]}}\n" for i in range(40)) + NODE
BIG_HOST = "x" * 200_000

CONFIGS: list[tuple[str, bytes, str]] = [
    ("binary", b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)), ":1: a NUL byte: this is a binary file, not YAML text"),
    ("not-utf8", b"name: d\xe9mo\nnodes: []\n", ":1: byte 0xe9 is not UTF-8: save the file as UTF-8 YAML text"),
    ("control-char", b"name: a\x07\n", ":1: invalid YAML: character U+0007 is not allowed in YAML text"),
    ("alias-bomb", BOMB.encode(), "invalid YAML: anchors and aliases expand to more than 100000 values"),
    ("merge-bomb", MERGE_BOMB.encode(), "invalid YAML: anchors and aliases expand to more than 100000 values"),
    ("deep", b"name: " + b"[" * 3000 + b"]" * 3000 + b"\n", ": invalid YAML: nested too deeply"),
    ("huge-int", f"{NODE}    port: {'9' * 5000}\n".encode(), ": invalid YAML: a value cannot be read"),
    ("bad-date", f"{NODE}state_dir: !!timestamp 2020-13-45\n".encode(), "a value cannot be read ('month must be"),
    ("too-big", b"# " + b"x" * 300_000 + b"\n" + NODE.encode(), ": larger than 256 KiB"),
    ("name-newline", b'name: "demo\\n"\nnodes:\n  - host: h\n', ":1: name: 'demo\\n' is not a valid name"),
    ("name-too-long", f"name: {'a' * 65}\nnodes:\n  - host: h\n".encode(), "is too long: a project name has at most 64"),
    ("host-semicolon", b"name: a\nnodes:\n  - host: a;b\n", "nodes[0].host: host 'a;b' is not a valid host name"),
    ("host-option", b"name: a\nnodes:\n  - host: -oProxyCommand=touch /tmp/x\n",
     "nodes[0].host: host '-oProxyCommand=touch /tmp/x' starts with '-', which ssh would read as an option"),
    ("host-user", b"name: a\nnodes:\n  - host: bob@gpu\n", "has a user in it: put the user under 'user:'"),
    ("host-port", b"name: a\nnodes:\n  - host: 'gpu:2222'\n", "is neither a host name nor an IP address: put a port"),
    ("host-brackets", b"name: a\nnodes:\n  - host: '[::1]'\n", "write an IPv6 address without brackets"),
    ("host-bad-ip", b"name: a\nnodes:\n  - host: 256.1.1.1\n", "host '256.1.1.1' is not a valid IP address"),
    ("host-space", b"name: a\nnodes:\n  - host: gpu 1\n", "host 'gpu 1' is not a valid host name"),
    ("host-newline", b'name: a\nnodes:\n  - host: "gpu\\n"\n', "host 'gpu\\n' is empty or has spaces around it"),
    ("host-huge", f"name: a\nnodes:\n  - host: {BIG_HOST}\n".encode(), "…' (200000 chars) is not a valid host"),
    ("node-name-newline", b'name: a\nnodes:\n  - {host: h, name: "a\\nb"}\n', "nodes[0].name: node name 'a\\nb' is not"),
    ("node-name-escape", b'name: a\nnodes:\n  - {host: h, name: "\\e[31m"}\n', "node name '\\x1b[31m' is not valid"),
    ("same-host-case", b"name: a\nnodes:\n  - {host: gpu-1}\n  - {host: GPU-1, name: b}\n",
     "nodes[1]: node 'b' is GPU-1 port 22 again (also nodes[0])"),
    ("localhost-twice", b"name: a\nnodes:\n  - {host: localhost}\n  - {host: localhost, name: other}\n",
     "nodes[1]: node 'other' is this machine again (also nodes[0])"),
    ("local-and-localhost", b"name: a\nnodes:\n  - {host: localhost}\n  - {host: local}\n", "is this machine again"),
    ("user-option", b"name: a\nnodes:\n  - {host: h, user: -oX}\n", "user '-oX' is not a valid user name"),
    ("user-at", b"name: a\nnodes:\n  - host: h\nssh:\n  user: a@b\n", "ssh.user: user 'a@b' is not a valid user"),
    ("state-dir-empty", f"{NODE}state_dir: ''\n".encode(), ":4: state_dir: must not be empty"),
    ("state-dir-root", f"{NODE}state_dir: /\n".encode(), "state_dir: '/' is the root or a home directory itself"),
    ("state-dir-home", f"{NODE}state_dir: '~'\n".encode(), "'~' is the root or a home directory itself"),
    ("state-dir-dotdot", f"{NODE}state_dir: ~/../x\n".encode(), "contains '..'"),
    ("state-dir-newline", f'{NODE}state_dir: "a\\nb"\n'.encode(), "'a\\nb' contains a control character"),
    ("known-hosts-newline", f'{NODE}ssh:\n  known_hosts: "a\\nb"\n'.encode(), "ssh.known_hosts: 'a\\nb' contains a"),
    ("identity-empty", f"{NODE}ssh:\n  identity_file: ''\n".encode(), "ssh.identity_file: must not be empty"),
    ("branch-newline", f'{NODE}default_branch: "main\\n"\n'.encode(), "'main\\n' is not a valid git branch name"),
    ("pip-option", f"{NODE}install:\n  source: --index-url=http://evil\n".encode(), "which pip would read as an option"),
    ("nproc-huge-word", f"{NODE}nproc_per_node: {'x' * 5000}\n".encode(), "nproc_per_node: must be 'auto' or an "
     "integer >= 1 (got 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…' (5000 chars))"),
    ("index-url", f"{NODE}install:\n  index_url: ftp://x\n".encode(), "install.index_url: 'ftp://x' is not an http(s)"),
    ("timeout-inf", f"{NODE}ssh:\n  connect_timeout: .inf\n".encode(), "ssh.connect_timeout: input should be a finite"),
    ("tagged-timestamp", f"{NODE}state_dir: !!timestamp x\n".encode(), "invalid YAML: a value cannot be read"),
]
SECRETS = ["GITHUB_TOKEN", "PATH", "HIGGSFIELD_RUN", "HOME", "LD_PRELOAD", "PYTHONPATH", "CUDA_VISIBLE_DEVICES",
           "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "RUN_NAME", "PROJECT_NAME",
           "EXPERIMENT_NAME", "SSH_KEY", "TORCHELASTIC_RUN_ID", "RUNNER_TEMP", "ACTIONS_RUNTIME_TOKEN"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("data", "message"), [c[1:] for c in CONFIGS], ids=[c[0] for c in CONFIGS])
def test_bad_config_is_one_line(project: Path, capsys: pytest.CaptureFixture[str], data: bytes,
                                message: str) -> None:
    (project / "higgsfield.yml").write_bytes(data)
    line = refused(["config", "check"], capsys)
    assert line.startswith(f"error: {project / 'higgsfield.yml'}"), line
    assert message in line, line


@pytest.mark.parametrize("secret", SECRETS)
def test_reserved_secret_names_are_refused(project: Path, capsys: pytest.CaptureFixture[str], secret: str) -> None:
    (project / "higgsfield.yml").write_text(f"{NODE}secrets: [WANDB_API_KEY, {secret}]\n")
    line = refused(["config", "check"], capsys)
    assert f"higgsfield.yml:4: secrets: secret name '{secret}' is reserved" in line, line


@pytest.mark.parametrize(("secret", "quoted"), [('"A\\n"', "'A\\n'"), ("wandb", "'wandb'"), ('"A B"', "'A B'")])
def test_secret_names_are_matched_in_full(project: Path, capsys: pytest.CaptureFixture[str], secret: str,
                                          quoted: str) -> None:
    (project / "higgsfield.yml").write_text(f"{NODE}secrets: [{secret}]\n")
    assert f"secrets: {quoted} is not a valid secret name" in refused(["config", "check"], capsys)


def test_hosts_that_are_fine(project: Path) -> None:
    from higgsfield.control.config import load_config

    hosts = ["gpu-1.example.com", "gpu-2.example.com.", "10.0.0.2", "::1", "fe80::1%eth0", "node_7", "LOCALHOST"]
    (project / "higgsfield.yml").write_text("name: a\nnodes:\n" + "".join(
        f"  - {{host: '{h}', name: n{i}}}\n" for i, h in enumerate(hosts)))
    cfg = load_config()
    assert [n.host for n in cfg.nodes] == hosts and cfg.nodes[-1].is_local


def test_config_that_is_not_a_regular_file(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(["--config", "/dev/zero", "config", "check"], capsys) == "error: /dev/zero: not a regular file\n"
    os.mkfifo(project / "fifo.yml")   # reading a FIFO nobody writes would block forever
    assert refused(["--config", "fifo.yml", "config", "check"], capsys).endswith("fifo.yml: not a regular file\n")
    line = refused(["--config", str(project), "config", "check"], capsys)   # a directory: click's own check
    assert "is a directory" in line and "(see 'higgsfield --help')" in line


# -- the env file ---------------------------------------------------------------

ENV_FILES = [
    ("not-utf8", b"WANDB_API_KEY=\xff\xfe\n", "env:1: byte 0xff is not UTF-8"),
    ("nul", b"A=1\nWANDB_API_KEY=a\x00b\n", "env:2: a NUL byte: this is a binary file"),
    ("bad-key", b"A-B=1\n", "env:1: 'A-B' is not a variable name"),
    ("twice", b"WANDB_API_KEY=a\nWANDB_API_KEY=b\n", "env:2: WANDB_API_KEY is set twice"),
    ("no-equals", b"# ok\nWANDB_API_KEY\n", "env:2: expected KEY=VALUE"),
    ("huge", b"A=" + b"x" * (1024 * 1024 + 1) + b"\n", "env: larger than 1024 KiB"),
]


@pytest.mark.parametrize(("data", "message"), [c[1:] for c in ENV_FILES], ids=[c[0] for c in ENV_FILES])
def test_bad_env_file_is_one_line(project: Path, capsys: pytest.CaptureFixture[str], data: bytes,
                                  message: str) -> None:
    (project / "higgsfield.yml").write_text(f"{NODE}secrets: [WANDB_API_KEY]\n")
    (project / "env").write_bytes(data)
    line = refused(["config", "check"], capsys)
    assert line.startswith(f"error: {project / 'env'}") and message in line, line


def test_a_value_with_a_line_separator_stays_one_value(project: Path) -> None:
    from higgsfield.control.secrets import load_env_file

    (project / "env").write_text("A=x\u2028y\fz\nB=2\n")   # str.splitlines() would cut A at U+2028
    assert load_env_file(project / "env") == {"A": "x\u2028y\fz", "B": "2"}


# -- experiment sources ---------------------------------------------------------

def _src(body: str) -> str:
    return f"from higgsfield.experiment import experiment, param\n\n{body}\ndef train(params):\n    pass\n"


SOURCES: list[tuple[str, dict[str, bytes], str]] = [
    ("too-deep-for-ast", {"deep.py": ("from higgsfield.experiment import experiment\nx = " + "-" * 100_000
                                      + "1\n").encode()}, "src/deep.py: an expression is nested too deeply"),
    ("too-long-for-ast", {"long.py": ("from higgsfield.experiment import experiment\nx = " + "1+" * 100_000
                                      + "1\n").encode()}, "src/long.py: an expression is nested too deeply"),
    ("nested-parens", {"p.py": _src('@experiment("e")\n@param("x", default=' + "(" * 300 + "1" + ")" * 300
                                    + ")").encode()}, "src/p.py:4: syntax error: too many nested parentheses"),
    ("not-utf8", {"t.py": b"# higgsfield \xff\n"}, "src/t.py: byte 0xff at offset 13 is not UTF-8"),
    ("nul", {"t.py": b"import higgsfield\x00\n"}, "src/t.py: syntax error: source code string cannot contain null bytes"),
    ("dotted-file", {"train.v2.py": _src('@experiment("e")').encode()},
     "src/train.v2.py: it defines an experiment, but file name 'train.v2' is not a Python identifier"),
    ("dash-file", {"my-exp.py": _src('@experiment("e")').encode()}, "file name 'my-exp' is not a Python identifier"),
    ("keyword-file", {"class.py": _src('@experiment("e")').encode()}, "file name 'class' is not a Python identifier"),
    ("dash-dir", {"my-pkg/train.py": _src('@experiment("e")').encode()},
     "directory name 'my-pkg' is not a Python identifier"),
    ("param-keyword", {"t.py": _src('@experiment("e")\n@param("class", default=1)').encode()},
     "src/t.py:4: @param name 'class' is a Python keyword: choose another name"),
    ("param-dict-method", {"t.py": _src('@experiment("e")\n@param("items", default=1)').encode()},
     "@param name 'items' is taken by the params object itself"),
    ("param-newline", {"t.py": _src('@experiment("e")\n@param("x\\n", default=1)').encode()},
     "@param name 'x\\n' is not valid"),
    ("experiment-newline", {"t.py": _src('@experiment("e\\n")').encode()}, "experiment name 'e\\n' is not valid"),
    ("experiment-case", {"a.py": _src('@experiment("Alpaca")').encode(), "b.py": _src('@experiment("alpaca")').encode()},
     "experiment 'alpaca' is already defined at src/a.py:3 (as 'Alpaca': names may not differ only in case)"),
    ("seed-too-big", {"t.py": _src('@experiment("e", seed=2**70)').encode()}, "seed must be a literal value"),
    ("seed-out-of-range", {"t.py": _src(f'@experiment("e", seed={2 ** 70})').encode()}, "seed must fit in 64 bits"),
    ("options-not-a-list", {"t.py": _src('@experiment("e")\n@param("x", options=5)').encode()},
     "@param 'x': options must be a non-empty list"),
    ("type-unhashable", {"t.py": _src('@experiment("e")\n@param("x", type=[1])').encode()},
     "type must be int, float, str or bool (got [1])"),
    ("nul-default", {"t.py": _src('@experiment("e")\n@param("x", default="a\\x00b")').encode()},
     "a NUL character cannot be a param value"),
    ("huge-expression", {"t.py": _src('@experiment("e")\n@param("x", default=f(' + "1, " * 10_000 + "))").encode()},
     "default must be a literal value (a number, string, bool, None or list of them), not 'f(1, 1, 1,"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("files", "message"), [c[1:] for c in SOURCES], ids=[c[0] for c in SOURCES])
def test_bad_experiment_source_is_one_line_and_writes_nothing(project: Path, capsys: pytest.CaptureFixture[str],
                                                              files: dict[str, bytes], message: str) -> None:
    (project / "higgsfield.yml").write_text(NODE)
    for rel, data in files.items():
        (project / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / "src" / rel).write_bytes(data)
    line = refused(["build-experiments"], capsys)
    assert message in line, line
    assert not (project / ".github").exists()
    assert refused(["experiments"], capsys) == line


def test_a_helper_script_with_a_dash_is_fine_when_it_defines_no_experiment(project: Path) -> None:
    from higgsfield.control.project.discovery import discover

    (project / "src" / "prepare-data.py").write_text("import higgsfield\nprint('hi')\n")
    (project / "src" / "train.py").write_text(_src('@experiment("e")'))
    assert [(e.name, e.module) for e in discover(project / "src")] == [("e", "train")]


# -- CLI arguments --------------------------------------------------------------

ARGS = [
    (["run", "alpaca", "--nodes", "0"], "Invalid value for '--nodes': 0 is not in the range x>=1"),
    (["run", "alpaca", "--nodes", "-3"], "Invalid value for '--nodes': -3 is not in the range x>=1"),
    (["run", "alpaca", "--max-restarts", "-5"], "'--max-restarts': -5 is not in the range 0<=x<=1000"),
    (["run", "alpaca", "--max-restarts", "many"], "'--max-restarts': 'many' is not a valid integer range"),
    (["run", "alp-aca"], "Invalid value for 'EXPERIMENT': experiment name 'alp-aca' is not valid"),
    (["run", "alpaca\n"], "experiment name 'alpaca\\n' is not valid"),
    (["run", "alpaca", "--run-name", "../x"], "'--run-name': '../x' is not a run or experiment name"),
    (["run", "alpaca", "--run-name", "x" * 10_000_000], "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…'"
                                                         " (10000000 chars) is not a run or experiment name"),
    (["run", "alpaca", "-p", "steps"], "--param 'steps': expected NAME=VALUE"),
    (["logs", "../../etc"], "Invalid value for 'EXPERIMENT|RUN': '../../etc' is not a run or experiment name"),
    (["logs", "alpaca", "--rank", "-1"], "Invalid value for '--rank': -1 is not in the range x>=0"),
    (["logs", "alpaca", "--since", "soon"], "'soon' is neither a duration ago"),
    (["kill", "a;b"], "'a;b' is not a run or experiment name"),
    (["kill", "--", "-rf"], "'-rf' is not a run or experiment name"),
    (["run"], "Missing argument 'EXPERIMENT'"),
    (["status", "--bogus"], "No such option '--bogus'. (see 'higgsfield status --help')"),
    (["init", "demo\n"], "'demo\\n' is not a valid project name"),
]


@pytest.mark.parametrize(("argv", "message"), ARGS, ids=[" ".join(a)[:40] for a, _ in ARGS])
def test_bad_cli_arguments_are_usage_errors(project: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str) -> None:
    (project / "higgsfield.yml").write_text(LOCAL)
    (project / "src" / "train.py").write_text(EXPERIMENT)
    forbid_start_and_kill(monkeypatch)
    before = sorted(p.name for p in project.iterdir())
    line = refused(argv, capsys)
    assert message in line, line
    assert sorted(p.name for p in project.iterdir()) == before   # init and friends wrote nothing
    assert not (project.parent / "home").exists()                 # not even a deploy key


def test_a_run_name_refused_says_the_length_the_rule_allows() -> None:
    import click

    from higgsfield.contract.names import MAX_RUN_NAME
    from higgsfield.control.cli._common import run_name

    longest = "r" * MAX_RUN_NAME
    assert run_name(None, None, longest) == longest  # type: ignore[arg-type]
    with pytest.raises(click.BadParameter, match=f"use 1-{MAX_RUN_NAME} letters, digits"):
        run_name(None, None, longest + "r")  # type: ignore[arg-type]


def test_since_long_ago_means_every_line() -> None:
    assert parse_since("0001-01-01") == 0.0              # datetime.timestamp() overflows here: that was a crash
    assert parse_since("1969-12-31T00:00:00+00:00") == 0.0
    assert parse_since("9" * 400 + "d", now=1000.0) == 0.0   # 1e400 days ago: -inf, clamped


# -- higgsfield ci inputs ---------------------------------------------------------

@pytest.fixture
def job(project: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checked-out project in a job: one remote node, known_hosts committed, the key written."""
    (project / "higgsfield.yml").write_text(NODE)
    (project / "src" / "train.py").write_text(EXPERIMENT)
    (project / ".higgsfield").mkdir()
    (project / ".higgsfield" / "known_hosts").write_text("gpu-1.example.com ssh-ed25519 AAAA\n")
    key = project.parent / "key"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    key.chmod(0o600)
    monkeypatch.setenv("HIGGSFIELD_SSH_KEY_FILE", str(key))
    forbid_start_and_kill(monkeypatch)
    return project


CI_ENV = [
    ({"HIGGSFIELD_RUN_NAME": "../x"}, "run_name '../x' is not valid"),
    ({"HIGGSFIELD_RUN_NAME": "a\nb"}, "run_name 'a\\nb' is not valid"),
    ({"HIGGSFIELD_NODES": "1e999"}, "nodes must be a whole number of nodes, got '1e999'"),
    ({"HIGGSFIELD_NODES": "nan"}, "nodes must be a whole number of nodes, got 'nan'"),
    ({"HIGGSFIELD_NODES": "9" * 400}, "nodes must be a whole number of nodes, got '999"),
    ({"HIGGSFIELD_NODES": "12"}, "nodes must be between 1 and 1 (higgsfield.yml lists 1), got '12'"),
    ({"HIGGSFIELD_MORE_PARAMS": "tag='x"}, "more_params: No closing quotation"),
    ({"HIGGSFIELD_PARAM_steps": "1" * 10_000_000}, "param 'steps': expected an integer, got '111"),
    ({"HIGGSFIELD_PARAM_tag": "a" * 70_000}, "param 'tag': a text value is at most 65536 characters (got 70000)"),
    ({"HIGGSFIELD_PARAM_nope": "1"}, "experiment 'alpaca' has no param 'nope', but the workflow passes it"),
]


@pytest.mark.parametrize(("env", "message"), CI_ENV, ids=[next(iter(e)) + str(i) for i, (e, _) in enumerate(CI_ENV)])
def test_bad_ci_run_inputs_are_refused_before_launching(job: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                                        message: str) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    line = refused(["ci", "run", "alpaca"], capsys)
    assert message in line, line


def test_bad_ci_arguments_and_key_files(job: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert "experiment name 'a b' is not valid" in refused(["ci", "run", "a b"], capsys)
    assert "'a;b' is not a run or experiment name" in refused(["ci", "kill", "a;b"], capsys)
    monkeypatch.setenv("HIGGSFIELD_KILL_TARGET", "$(id)")
    assert "'$(id)' is not a run or experiment name" in refused(["ci", "kill"], capsys)
    monkeypatch.setenv("HIGGSFIELD_SSH_KEY_FILE", "/dev/zero")   # would never end if read
    assert "/dev/zero: cannot read the SSH key: not a regular file" in refused(["ci", "deploy"], capsys)
    binary = job.parent / "binkey"
    binary.write_bytes(b"\xff" * 100)
    binary.chmod(0o600)
    monkeypatch.setenv("HIGGSFIELD_SSH_KEY_FILE", str(binary))
    assert "not an SSH private key (too big or not text)" in refused(["ci", "deploy"], capsys)


# -- the real CLI, in a subprocess ---------------------------------------------------

@pytest.mark.timeout(180)
def test_the_real_cli_refuses_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    cases: list[tuple[bytes, list[str], str]] = [
        (b"\x00\x01binary", ["config", "check"], "a NUL byte: this is a binary file, not YAML text"),
        (BOMB.encode(), ["config", "check"], "anchors and aliases expand to more than 100000 values"),
        (LOCAL.encode(), ["run", "alpaca", "--nodes", "0"], "Invalid value for '--nodes': 0 is not in the range"),
        (LOCAL.encode(), ["run", "alpaca", "--max-restarts", "-5"], "'--max-restarts': -5 is not in the range"),
    ]
    for data, argv, message in cases:
        (tmp_path / "higgsfield.yml").write_bytes(data)
        proc = run_cli(tmp_path, *argv)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert proc.stderr.count("\n") == 1 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    (tmp_path / "higgsfield.yml").write_bytes(BOMB.encode())
    proc = run_cli(tmp_path, "--debug", "config", "check")    # --debug still shows the traceback
    assert "Traceback" in proc.stderr and "ConfigError" in proc.stderr

"""higgsfield.yml validation: every bad config is one line naming file, line and field, exit 2.

One case of each kind named by the issue runs the real CLI in a subprocess
(``python -m higgsfield config check``: exit code, stderr, no traceback); the
other variants go through ``main()`` in-process (the same error path, without
the interpreter start) or :func:`parse_config`, to keep the suite fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_project import MINIMAL_CONFIG, assert_one_line_error, run_cli, write

from higgsfield.contract.errors import ConfigError
from higgsfield.control.cli import main
from higgsfield.control.config import find_config, json_schema, load_config, parse_config

# (id, higgsfield.yml, expected message after "<path>:")
CLI_CASES = [
    ("unknown-top-key", "name: a\nnodes:\n  - host: h1\nfoo: 1\n",
     "4: foo: unknown key 'foo' (allowed: name, slurm, nodes, ssh, nproc_per_node, runtime, secrets, state_dir, "
     "docker, install, default_branch, retention, checkpoint, notify, stall_timeout, startup_timeout, on_stall, on_straggler, min_nodes, spares, max_recoveries, preflight, data)"),
    ("root-in-ssh", "name: a\nnodes:\n  - host: h1\nssh:\n  user: root\n",
     "5: ssh.user: 'root' is refused: use a non-root user with passwordless sudo"),
    ("root-per-node", "name: a\nnodes:\n  - host: h1\n  - host: h2\n    user: root\n",
     "5: nodes[1].user: 'root' is refused: use a non-root user with passwordless sudo"),
    ("empty-node-list", "name: a\nnodes: []\n", "2: nodes: list at least one node (or describe a Slurm cluster in a slurm block)"),
    ("notify-unknown-event", "name: a\nnodes:\n  - host: h1\nnotify:\n  to: [HOOK]\n  events: [failed, exploded]\n",
     "6: notify.events[1]: must be 'started', 'succeeded', 'failed', 'stalled', 'recovered', 'lost' or 'straggler' "
     "(got 'exploded')"),
    ("notify-not-a-name", "name: a\nnodes:\n  - host: h1\nnotify:\n  to: ['https://hooks.slack.com/x']\n",
     "5: notify.to: 'https://hooks.slack.com/x' is not a valid secret name: use UPPER_CASE letters, digits and _: "
     "list the name of a secret here (SLACK_URL) and put its URL in the env file (SLACK_URL=slack://...)"),
    ("duplicated-node", "name: a\nnodes:\n  - host: h1\n  - host: h2\n  - host: h1\n",
     "5: nodes[2]: node 'h1' is listed twice (also nodes[0]); give each node a distinct host, port or name"),
    ("port-too-big", "name: a\nnodes:\n  - host: h1\n    port: 70000\n",
     "4: nodes[0].port: must be between 1 and 65535 (got 70000)"),
    ("name-leading-digit", "name: 1abc\nnodes:\n  - host: h1\n",
     "1: name: '1abc' is not a valid name: use letters, digits and _, not starting with a digit"),
    ("malformed-yaml", "name: a\nnodes:\n  - host: h1\n   port: 2\n",
     "4: invalid YAML: expected <block end>, but found '<block mapping start>'"),
    ("wrong-type", "name: a\nnodes:\n  - host: h1\n    port: abc\n",
     "4: nodes[0].port: expected an integer (got 'abc')"),
    ("duplicate-key", "name: a\nname: b\nnodes:\n  - host: h1\n", "2: key 'name' appears twice"),
    ("on-stall-unknown", "name: a\nnodes:\n  - host: h1\non_stall: retry\n",
     "4: on_stall: must be 'fail', 'restart' or 'wait' (got 'retry')"),
]

MAIN_CASES = [
    ("unknown-node-key", "name: a\nnodes:\n  - host: h1\n  - host: h2\n    prot: 22\n",
     "5: nodes[1].prot: unknown key 'prot' (allowed: host, name, port, user, identity_file, nproc_per_node)"),
    ("unknown-ssh-key", "name: a\nnodes:\n  - host: h1\nssh:\n  usr: bob\n",
     "5: ssh.usr: unknown key 'usr' (allowed: user, port, identity_file, known_hosts, connect_timeout, "
     "command_timeout, retries)"),
    ("no-node-list", "name: a\n", "1: nodes: list at least one node (or describe a Slurm cluster in a slurm block)"),
    ("duplicated-node-port", "name: a\nnodes:\n  - host: h1\n    port: 2201\n  - host: h1\n    port: 2201\n",
     "5: nodes[1]: node 'h1:2201' is listed twice (also nodes[0]); give each node a distinct host, port or name"),
    ("port-zero", "name: a\nnodes:\n  - host: h1\n    port: 0\n",
     "4: nodes[0].port: must be between 1 and 65535 (got 0)"),
    ("ssh-port-negative", "name: a\nnodes:\n  - host: h1\nssh:\n  port: -1\n",
     "5: ssh.port: must be between 1 and 65535 (got -1)"),
    ("name-with-dash", "name: my-proj\nnodes:\n  - host: h1\n",
     "1: name: 'my-proj' is not a valid name: use letters, digits and _, not starting with a digit"),
    ("unclosed-bracket", "name: [a\nnodes: x\n", "2: invalid YAML: expected ',' or ']', but got ':'"),
    ("nodes-not-a-list", "name: a\nnodes: h1\n", "2: nodes: expected a list (got 'h1')"),
    ("name-not-a-string", "name: 123\nnodes:\n  - host: h1\n", "1: name: expected a string (got 123)"),
    ("ssh-not-a-mapping", "name: a\nnodes:\n  - host: h1\nssh: [1]\n", "4: ssh: expected a mapping of keys (got [1])"),
    ("timeout-not-a-number", "name: a\nnodes:\n  - host: h1\nssh:\n  connect_timeout: soon\n",
     "5: ssh.connect_timeout: expected a number (got 'soon')"),
    ("nproc-word", "name: a\nnodes:\n  - host: h1\nnproc_per_node: many\n",
     "4: nproc_per_node: must be 'auto' or an integer >= 1 (got 'many')"),
    ("duplicate-nested-key", "name: a\nnodes:\n  - host: h1\n    host: h2\n", "4: key 'host' appears twice"),
]


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_bad_config_via_cli(tmp_path: Path, text: str, message: str) -> None:
    cfg = write(tmp_path / "higgsfield.yml", text).resolve()
    proc = run_cli(tmp_path, "config", "check")
    assert_one_line_error(proc, f"{cfg}:{message}")
    assert proc.stdout == ""


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in MAIN_CASES], ids=[c[0] for c in MAIN_CASES])
def test_bad_config_via_main(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                             text: str, message: str) -> None:
    cfg = write(tmp_path / "higgsfield.yml", text).resolve()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HIGGSFIELD_DEBUG", raising=False)
    with pytest.raises(SystemExit) as info:
        main(["config", "check"])
    assert info.value.code == 2
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", f"error: {cfg}:{message}\n")


# More cases, checked in-process through parse_config (same formatter, no subprocess).
PARSE_CASES = [
    ("port-float", "name: a\nnodes:\n  - host: h1\n    port: 22.5\n", "4: nodes[0].port: expected an integer (got 22.5)"),
    ("port-bool", "name: a\nnodes:\n  - host: h1\n    port: true\n", "4: nodes[0].port: expected a number, not true"),
    ("retries-bool", "name: a\nnodes:\n  - host: h1\nssh:\n  retries: yes\n",
     "5: ssh.retries: expected a number, not true"),
    ("nproc-zero", "name: a\nnodes:\n  - host: h1\nnproc_per_node: 0\n",
     "4: nproc_per_node: must be 'auto' or an integer >= 1 (got 0)"),
    ("nproc-bool", "name: a\nnodes:\n  - host: h1\nnproc_per_node: true\n",
     "4: nproc_per_node: must be 'auto' or an integer >= 1 (got True)"),
    ("node-nproc-word", "name: a\nnodes:\n  - host: h1\n    nproc_per_node: x\n",
     "4: nodes[0].nproc_per_node: must be 'auto' or an integer >= 1 (got 'x')"),
    ("root-first-node", "name: a\nnodes:\n  - host: h1\n    user: root\n",
     "4: nodes[0].user: 'root' is refused: use a non-root user with passwordless sudo"),
    ("nodes-null", "name: a\nnodes:\n", "2: nodes: expected a list (got None)"),
    ("node-as-string", "name: a\nnodes:\n  - h1\n", "3: nodes[0]: expected a mapping of keys (got 'h1')"),
    ("host-missing", "name: a\nnodes:\n  - port: 22\n", "3: nodes[0].host: is required"),
    ("name-missing", "nodes:\n  - host: h1\n", "1: name: is required"),
    ("secrets-string", "name: a\nnodes:\n  - host: h1\nsecrets: WANDB\n", "4: secrets: expected a list (got 'WANDB')"),
    ("secret-lowercase", "name: a\nnodes:\n  - host: h1\nsecrets: [wandb]\n",
     "4: secrets: 'wandb' is not a valid secret name: use UPPER_CASE letters, digits and _"),
    ("secret-twice", "name: a\nnodes:\n  - host: h1\nsecrets: [A, A]\n", "4: secrets: a secret is listed twice"),
    ("runtime-unknown", "name: a\nnodes:\n  - host: h1\nruntime: k8s\n",
     "4: runtime: must be 'auto', 'docker' or 'process' (got 'k8s')"),
    ("nested-unknown", "name: a\nnodes:\n  - host: h1\ndocker:\n  file: x\n",
     "5: docker.file: unknown key 'file' (allowed: dockerfile, base_image)"),
    ("tab-indent", "name: a\nnodes:\n\t- host: h1\n", "3: invalid YAML: found character '\\t' that cannot start any token"),
    ("two-documents", "name: a\nnodes:\n  - host: h1\n---\nname: b\n",
     "4: invalid YAML: expected a single document in the stream, but found another document"),
    ("number-key", "name: a\nnodes:\n  - host: h1\n1: x\n", "4: key '1' must be a name, not a number or bool"),
    ("complex-key", "name: a\nnodes:\n  - host: h1\n? [a]\n: 1\n", "4: a key must be a name, not a list or mapping"),
    ("top-level-scalar", "hello\n", "1: the top level must be a mapping of keys (name, nodes, ...)"),
    ("stall-negative", "name: a\nnodes:\n  - host: h1\nstall_timeout: -5\n",
     "4: stall_timeout: input should be greater than or equal to 0 (got -5)"),
    ("stall-word", "name: a\nnodes:\n  - host: h1\nstall_timeout: 10m\n",
     "4: stall_timeout: expected a number (got '10m')"),
    ("stall-bool", "name: a\nnodes:\n  - host: h1\nstall_timeout: yes\n", "4: stall_timeout: expected a number, not true"),
    ("startup-inf", "name: a\nnodes:\n  - host: h1\nstartup_timeout: .inf\n",
     "4: startup_timeout: input should be a finite number (got inf)"),
    ("on-stall-number", "name: a\nnodes:\n  - host: h1\non_stall: 1\n",
     "4: on_stall: must be 'fail', 'restart' or 'wait' (got 1)"),
    ("two-problems", "name: 1a\nnodes: []\n",
     "1: name: '1a' is not a valid name: use letters, digits and _, not starting with a digit (and 1 more problem)"),
]


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in PARSE_CASES], ids=[c[0] for c in PARSE_CASES])
def test_bad_config_message(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, Path("higgsfield.yml"))
    assert str(info.value) == f"higgsfield.yml:{message}"
    assert "\n" not in str(info.value)


def test_empty_file() -> None:
    with pytest.raises(ConfigError, match=r"^higgsfield.yml: the file is empty; it needs at least 'name' and 'nodes'$"):
        parse_config("", Path("higgsfield.yml"))


def test_bad_config_via_main_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write(tmp_path / "cluster.yml", "name: a\nnodes: []\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["--config", "cluster.yml", "config", "check"])
    assert info.value.code == 2
    assert capsys.readouterr().err == f"error: {cfg.name}:2: nodes: list at least one node (or describe a Slurm cluster in a slurm block)\n"


def test_missing_config_file(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, "config", "check")
    assert_one_line_error(proc, f"no higgsfield.yml in {tmp_path.resolve()} or above: run 'higgsfield init NAME' "
                                "to create a project, or pass --config")
    proc = run_cli(tmp_path, "--config", "nope.yml", "config", "check")
    assert_one_line_error(proc, "nope.yml: file not found")


def test_debug_shows_traceback(tmp_path: Path) -> None:
    write(tmp_path / "higgsfield.yml", "name: a\nnodes: []\n")
    proc = run_cli(tmp_path, "--debug", "config", "check")
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "ConfigError" in proc.stderr


# -- good configs -------------------------------------------------------------

def test_good_config_defaults_and_derived_values(tmp_path: Path) -> None:
    path = write(tmp_path / "higgsfield.yml", """\
        name: my_llama
        nodes:
          - host: gpu-1.example.com
          - host: gpu-2.example.com
            port: 2201
            user: alice
            nproc_per_node: 4
          - host: localhost
        ssh:
          user: ubuntu
          identity_file: ~/.ssh/id_ed25519
        nproc_per_node: 8
        secrets: [WANDB_API_KEY, HF_TOKEN]
        """)
    cfg = load_config(path)
    assert cfg.path == path.resolve()
    assert cfg.project_dir == tmp_path.resolve()
    assert [n.name for n in cfg.nodes] == ["gpu-1.example.com", "gpu-2.example.com:2201", "localhost"]
    n0, n1, n2 = cfg.nodes
    assert (cfg.node_port(n0), cfg.node_user(n0), cfg.node_nproc(n0)) == (22, "ubuntu", 8)
    assert (cfg.node_port(n1), cfg.node_user(n1), cfg.node_nproc(n1)) == (2201, "alice", 4)
    assert n2.is_local and not n0.is_local
    assert cfg.node_identity(n0) == str(Path("~/.ssh/id_ed25519").expanduser())
    assert cfg.known_hosts_path == tmp_path.resolve() / ".higgsfield" / "known_hosts"
    assert cfg.env_file == tmp_path.resolve() / "env"
    assert cfg.runtime == "auto" and cfg.ssh.connect_timeout == 10
    assert cfg.node("gpu-2.example.com") is n1
    with pytest.raises(ConfigError, match="no node named 'nope'"):
        cfg.node("nope")


def test_quoted_number_and_auto_are_accepted(tmp_path: Path) -> None:
    cfg = parse_config("name: a\nnodes:\n  - host: h\n    port: '2201'\nnproc_per_node: auto\n", tmp_path / "x.yml")
    assert cfg.nodes[0].port == 2201 and cfg.nproc_per_node == "auto"


def test_same_host_distinct_users_is_allowed() -> None:
    # Two logins on one machine: two homes, two state directories (the test bed's layout on one box).
    cfg = parse_config("name: a\nnodes:\n  - {host: h, name: one, user: u1}\n  - {host: h, name: two, user: u2}\n",
                       Path("x.yml"))
    assert [n.name for n in cfg.nodes] == ["one", "two"]


@pytest.mark.parametrize("nodes", [
    "  - {host: h, name: one}\n  - {host: h, name: two}",          # one login, two names: one state dir
    "  - {host: gpu-1}\n  - {host: GPU-1, name: b}",               # DNS names ignore case
    "  - {host: localhost}\n  - {host: local, name: other}",        # both mean this machine
    "  - {host: localhost}\n  - {host: LOCALHOST, name: b}",
    "  - {host: h, user: u}\n  - {host: h., name: h2, user: u}",     # a trailing dot is the same name
])
def test_one_login_listed_twice_is_refused(nodes: str) -> None:
    with pytest.raises(ConfigError, match=r"^x.yml:4: nodes\[1\]: node '.*' is .* again \(also nodes\[0\]\): two nodes "
                                          "for one login would share one state directory; list each machine once$"):
        parse_config(f"name: a\nnodes:\n{nodes}\n", Path("x.yml"))


def test_node_names_differing_in_case_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"nodes\[1\]: node 'A' is listed twice \(also nodes\[0\]\)"):
        parse_config("name: a\nnodes:\n  - {host: h1, name: a}\n  - {host: h2, name: A}\n", Path("x.yml"))


def test_find_config_walks_up(tmp_path: Path) -> None:
    path = write(tmp_path / "higgsfield.yml", MINIMAL_CONFIG)
    deep = tmp_path / "src" / "a" / "b"
    deep.mkdir(parents=True)
    assert find_config(deep) == path.resolve()


def test_config_check_summary(tmp_path: Path) -> None:
    write(tmp_path / "higgsfield.yml", """\
        name: demo
        nodes:
          - host: gpu-1
          - host: gpu-2
            port: 2201
            user: alice
          - host: localhost
        ssh:
          user: ubuntu
        nproc_per_node: 2
        runtime: process
        secrets: [WANDB_API_KEY, HF_TOKEN, EMPTY_ONE]
        """)
    env = tmp_path / "env"
    env.write_text("# comment\nWANDB_API_KEY=sekrit-value\nEMPTY_ONE=\n")
    env.chmod(0o600)
    proc = run_cli(tmp_path, "config", "check")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    out = proc.stdout
    assert out.splitlines()[0] == f"{(tmp_path / 'higgsfield.yml').resolve()}: ok"
    assert "name:           demo" in out
    assert "nodes:          3" in out
    lines = [ln.split() for ln in out.splitlines()]
    assert ["0", "gpu-1", "22", "ubuntu", "gpu-1", "(master)"] in lines
    assert ["1", "gpu-2", "2201", "alice", "gpu-2:2201"] in lines
    assert ["2", "local", "-", "-", "localhost"] in lines
    assert "nproc_per_node: 2" in out and "runtime:        process" in out
    assert "WANDB_API_KEY: set in env" in out
    assert "HF_TOKEN: not set in env" in out
    assert "EMPTY_ONE: empty in env" in out
    assert "sekrit-value" not in out


def test_config_check_warns_on_readable_env(tmp_path: Path) -> None:
    write(tmp_path / "higgsfield.yml", MINIMAL_CONFIG + "ssh:\n  user: ubuntu\n")
    (tmp_path / "env").write_text("A=1\n")
    (tmp_path / "env").chmod(0o644)
    proc = run_cli(tmp_path, "config", "check")
    assert proc.returncode == 0
    assert "is readable by others: chmod 600" in proc.stderr


# -- the JSON Schema ----------------------------------------------------------

def test_schema_command_prints_a_valid_schema(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    proc = run_cli(tmp_path, "config", "schema")  # needs no higgsfield.yml
    assert proc.returncode == 0, proc.stderr
    schema = json.loads(proc.stdout)
    assert schema == json.loads(json.dumps(json_schema()))
    jsonschema.Draft202012Validator.check_schema(schema)
    assert "path" not in schema["properties"]
    assert schema["additionalProperties"] is False
    node = schema["$defs"]["NodeConfig"]["properties"]["port"]["anyOf"][0]
    assert (node["minimum"], node["maximum"]) == (1, 65535)
    v = jsonschema.Draft202012Validator(schema)
    assert not list(v.iter_errors({"name": "a", "nodes": [{"host": "h", "port": 2201}]}))
    assert list(v.iter_errors({"name": "a", "nodes": [{"host": "h", "port": 70000}]}))
    assert list(v.iter_errors({"name": "a", "nodes": [{"host": "h"}], "extra": 1}))


def test_default_user_is_never_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ssh.user the local user name is used, and a root laptop user is refused, not sent."""
    import getpass

    from higgsfield.contract.errors import ConfigError
    from higgsfield.control.config import parse_config

    cfg = parse_config(MINIMAL_CONFIG, tmp_path / "higgsfield.yml")
    monkeypatch.setattr(getpass, "getuser", lambda: "root")
    with pytest.raises(ConfigError, match="no ssh.user is set and your local user is root"):
        cfg.node_user(cfg.nodes[0])
    monkeypatch.setattr(getpass, "getuser", lambda: "alice")
    assert cfg.node_user(cfg.nodes[0]) == "alice"


@pytest.mark.parametrize("branch", ['main\n"on": {push: {}}\n#', "-x", "/main", "a..b", "a b", "main:x", "a//b",
                                    "release/", ".hidden", "x.lock", "$(id)", ""])
def test_default_branch_must_be_a_git_branch_name(branch: str) -> None:
    text = "name: a\nnodes:\n  - host: h\ndefault_branch: " + json.dumps(branch) + "\n"
    with pytest.raises(ConfigError, match="default_branch") as err:
        parse_config(text, Path("higgsfield.yml"))
    assert "\n" not in str(err.value) and "is not a valid git branch name" in str(err.value)


@pytest.mark.parametrize("branch", ["main", "trunk", "release/1.2", "feature_x-y.z"])
def test_default_branch_accepts_branch_names(branch: str) -> None:
    cfg = parse_config(f"name: a\nnodes:\n  - host: h\ndefault_branch: {branch}\n", Path("higgsfield.yml"))
    assert cfg.default_branch == branch


def test_stall_settings_default_and_set() -> None:
    from higgsfield.contract.runspec import ON_STALL, RunSpec

    cfg = parse_config("name: a\nnodes:\n  - host: h1\n", Path("higgsfield.yml"))
    assert (cfg.stall_timeout, cfg.startup_timeout, cfg.on_stall) == (600.0, 1800.0, "fail")
    # the same defaults as the spec the nodes get, and the same choices
    spec_defaults = {f: RunSpec.__dataclass_fields__[f].default for f in ("stall_timeout", "startup_timeout", "on_stall")}
    assert spec_defaults == {"stall_timeout": 600.0, "startup_timeout": 1800.0, "on_stall": "fail"}
    assert set(json_schema()["properties"]["on_stall"]["enum"]) == set(ON_STALL)
    cfg = parse_config("name: a\nnodes:\n  - host: h1\nstall_timeout: 0\nstartup_timeout: 90.5\non_stall: wait\n",
                       Path("higgsfield.yml"))
    assert (cfg.stall_timeout, cfg.startup_timeout, cfg.on_stall) == (0.0, 90.5, "wait")


def test_a_node_is_named_by_its_host_alone_when_no_other_node_shares_it(tmp_path: Path) -> None:
    """Every node on port 2222 is named ``host:2222``; its host alone names it too (``--exclude 10.0.0.3``)."""
    from higgsfield.control.backends.nodes.start import _candidates

    cfg = parse_config("name: a\nssh:\n  port: 2222\nnodes:\n  - host: 10.0.0.2\n  - host: 10.0.0.3\n"
                       "  - host: 10.0.0.9\n    port: 2201\n    name: box-a\n  - host: 10.0.0.9\n    name: box-b\n",
                       tmp_path / "higgsfield.yml")
    assert [n.name for n in cfg.nodes] == ["10.0.0.2:2222", "10.0.0.3:2222", "box-a", "box-b"]
    assert cfg.node("10.0.0.3") is cfg.node("10.0.0.3:2222") is cfg.nodes[1]
    assert cfg.node("10.0.0.9:2201") is cfg.nodes[2] and cfg.node("box-b") is cfg.nodes[3]
    with pytest.raises(ConfigError, match=r"'10.0.0.9' is 2 nodes \(box-a, box-b\): name one of them"):
        cfg.node("10.0.0.9")
    assert [n.name for n in _candidates(cfg, ("10.0.0.3", "box-b"))] == ["10.0.0.2:2222", "box-a"]
    with pytest.raises(ConfigError, match=r"--exclude 10.0.0.7: no such node \(the nodes are 10.0.0.2:2222, "):
        _candidates(cfg, ("10.0.0.7",))


def test_notify_destinations_are_secrets_read_like_the_others_and_kept_from_the_training(tmp_path: Path) -> None:
    from higgsfield.control import secrets

    cfg = parse_config("name: a\nnodes:\n  - host: h1\nsecrets: [HF_TOKEN]\nnotify:\n  to: [SLACK, HOOK]\n",
                       tmp_path / "higgsfield.yml")
    assert cfg.notify is not None and cfg.notify.events == ["succeeded", "failed", "stalled", "recovered", "lost", "straggler"]
    write(tmp_path / "env", "HF_TOKEN=t\nSLACK=slack://a/b/c\n")
    got = secrets.notify(cfg, {"HOOK": "json://h/p"})
    assert got.urls == ("slack://a/b/c", "json://h/p") and got.wants("failed") and not got.wants("started")
    assert secrets.collect(cfg, {"HOOK": "json://h/p"}) == {"HF_TOKEN": "t"}   # never in the run's environment
    with pytest.raises(ConfigError, match=r"notify destination HOOK named in higgsfield.yml is not set; add "
                                          r"HOOK=<apprise URL> to the env file"):
        secrets.notify(cfg, {})
    assert not secrets.notify(parse_config("name: a\nnodes:\n  - host: h1\n", tmp_path / "x.yml")).urls

"""The ``slurm:`` block of higgsfield.yml: typed like every other key, one line per mistake, in the JSON Schema."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_project import assert_one_line_error, run_cli, write

from higgsfield.contract.errors import ConfigError
from higgsfield.control.backends.slurm.backend import SlurmBackend
from higgsfield.control.config import json_schema, parse_config
from higgsfield.control.config.slurm import SlurmConfig

pytestmark = pytest.mark.timeout(60)

BLOCK = """\
name: lab
slurm:
  login: {host: login.cluster.example, user: me}
  partition: gpu
  account: my-lab
  nodes: 8
  gpus_per_node: 8
  time: "24:00:00"
  workdir: /shared/me/higgsfield
"""


def parse(text: str, tmp_path: Path) -> object:
    return parse_config(text, tmp_path / "higgsfield.yml")


def test_the_issue_block_parses_without_nodes(tmp_path: Path) -> None:
    cfg = parse(BLOCK, tmp_path)
    assert cfg.slurm is not None and cfg.nodes == []
    s = cfg.slurm
    assert (s.login.host, s.login.user, s.login.port, s.login.name) == ("login.cluster.example", "me", 22, "login")
    assert (s.partition, s.account, s.nodes, s.gpus_per_node, s.time) == ("gpu", "my-lab", 8, 8, "24:00:00")
    assert s.workdir == "/shared/me/higgsfield" and s.exclusive and s.extra == []
    assert s.interpreter == "/shared/me/higgsfield/venv/bin/python"
    assert SlurmBackend(cfg).settings is s   # one model: the backend runs with the block as loaded


def test_the_login_node_is_the_projects_one_node(tmp_path: Path) -> None:
    cfg = parse(BLOCK + "nodes:\n  - host: gpu-1\n", tmp_path)
    login = cfg.on_login_node()
    assert [(n.host, n.name, n.user) for n in login.nodes] == [("login.cluster.example", "login", "me")]
    assert login.state_dir == "/shared/me/higgsfield" and login.runtime == "process"
    assert [n.host for n in cfg.nodes] == ["gpu-1"]   # listed, not used


@pytest.mark.parametrize(("change", "expected"), [
    ("  qos: high\n", "slurm.qos: unknown key 'qos' (allowed: login, workdir, partition, account, nodes, "
                      "gpus_per_node, cpus_per_task, time, python, exclusive, extra)"),
    ("  time: 1h\n", "slurm.time: '1h' is not a Slurm time limit"),
    ("  nodes: 0\n", "slurm.nodes: input should be greater than or equal to 1"),
    ("  workdir: shared/me\n", "slurm.workdir: 'shared/me' must be an absolute path"),
    ("  partition: 'gpu; rm -rf /'\n", "slurm.partition: 'gpu; rm -rf /' is not a partition name"),
    ("  extra: ['--qos high']\n", "slurm.extra: '--qos high' is not one sbatch option"),
    ("  login: {host: h, user: root}\n", "slurm.login.user"),
    ("  login: {host: h, password: x}\n", "slurm.login.password: unknown key 'password'"),
])
def test_a_bad_value_is_one_line_naming_file_line_and_field(tmp_path: Path, change: str, expected: str) -> None:
    lines = BLOCK.splitlines(keepends=True)
    key = change.split(":", 1)[0]
    text = "".join(ln for ln in lines if not ln.startswith(key + ":")) + change
    line = len(text.splitlines())   # the changed key is the last line
    with pytest.raises(ConfigError) as info:
        parse(text, tmp_path)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{tmp_path / 'higgsfield.yml'}:{line}: {expected}"), msg
    assert "more problem" not in msg


def test_preflight_is_refused_beside_a_slurm_block_and_kept_for_ssh_nodes(tmp_path: Path) -> None:
    """'preflight: true' would make every run of a Slurm project fail on a flag it never gave: said once, here."""
    text = BLOCK + "preflight: true\n"
    with pytest.raises(ConfigError) as info:
        parse(text, tmp_path)
    assert str(info.value) == (f"{tmp_path / 'higgsfield.yml'}:{len(text.splitlines())}: preflight: true is for SSH "
                               "nodes: on a Slurm cluster the allocation picks the nodes (doctor --fabric tests the "
                               "partition, run --exclude keeps a node out); remove it")
    assert parse(BLOCK + "preflight: false\n", tmp_path).preflight is False  # type: ignore[attr-defined]
    assert parse("name: lab\nnodes: [{host: a}, {host: b}]\npreflight: true\n",
                 tmp_path).preflight is True  # type: ignore[attr-defined]


def test_without_nodes_or_slurm_the_error_says_both(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nodes: list at least one node \(or describe a Slurm cluster"):
        parse("name: lab\n", tmp_path)


def test_login_shorthand_and_defaults(tmp_path: Path) -> None:
    cfg = parse("name: lab\nslurm:\n  login: login.example\n  workdir: /scratch/lab\n  time: 90\n", tmp_path)
    assert cfg.slurm is not None
    assert (cfg.slurm.login.host, cfg.slurm.nodes, cfg.slurm.time, cfg.slurm.partition) == \
        ("login.example", 1, "90", None)


def test_json_schema_describes_the_block() -> None:
    schema = json_schema()
    slurm = schema["$defs"]["SlurmConfig"]
    assert {"login", "workdir", "partition", "account", "nodes", "gpus_per_node", "time"} <= set(slurm["properties"])
    assert slurm["additionalProperties"] is False and set(slurm["required"]) == {"login", "workdir"}
    assert "nodes" not in schema.get("required", [])


def test_config_check_from_the_cli(tmp_path: Path) -> None:
    write(tmp_path / "higgsfield.yml", BLOCK.replace('time: "24:00:00"', "time: soon"))
    assert_one_line_error(run_cli(tmp_path, "config", "check"),
                          f"{tmp_path / 'higgsfield.yml'}:8: slurm.time: 'soon' is not a Slurm time limit: write "
                          "minutes (90), HH:MM:SS (24:00:00) or D-HH:MM:SS (2-00:00:00), quoted in YAML")


def test_run_flags_override_nodes_time_partition() -> None:
    s = SlurmConfig.model_validate({"login": "h", "workdir": "/w", "nodes": 2, "time": "10", "partition": "a"})
    o = s.override(nodes=4, time="1:00:00", partition="b")
    assert (o.nodes, o.time, o.partition) == (4, "1:00:00", "b")
    assert (s.nodes, s.time, s.partition) == (2, "10", "a")   # the loaded block is left as it is
    assert s.override().model_dump() == s.model_dump()
    with pytest.raises(ConfigError, match="^--time: 'x' is not a Slurm time limit"):
        s.override(time="x")
    for bad, msg in ((dict(nodes=0), "--nodes: expected a whole number from 1 to 4096 (got 0)"),
                     (dict(nodes=True), "--nodes: expected a whole number from 1 to 4096 (got True)"),
                     (dict(partition="a;b"), "--partition: 'a;b' is not a partition name: use letters, digits, "
                                             "_ . - (several partitions joined by commas)"),
                     (dict(time="0", where="run: "), "run: --time: '0' is a time limit of zero: give the run "
                                                     "some time")):
        with pytest.raises(ConfigError) as e:
            s.override(**bad)  # type: ignore[arg-type]
        assert str(e.value) == msg


def test_metrics_of_a_slurm_project_asks_its_login_node(tmp_path: Path) -> None:
    """``metrics`` goes through the Slurm backend (the login node), not the SSH nodes: one line naming it."""
    write(tmp_path / "higgsfield.yml", BLOCK)
    assert_one_line_error(run_cli(tmp_path, "metrics", "some-run"),
                          "login: cannot resolve host 'login.cluster.example': Name or service not known", code=1)

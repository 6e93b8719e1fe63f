"""A project's standing recovery policy (issue 30): ``min_nodes``, ``spares`` and ``max_recoveries`` in
higgsfield.yml reach every run a plan is made for (``run``, ``ci run``, the dashboard's), the flags of
``run`` win, and a value that cannot work is one line naming the field (exit 2). No node is reached."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers_project import run_cli

from higgsfield.contract.errors import ConfigError
from higgsfield.control.backends import backend_for
from higgsfield.control.backends.backend import RunRequest
from higgsfield.control.config import parse_config

pytestmark = pytest.mark.timeout(60)

PROBE_EXPERIMENT = "from higgsfield.experiment import experiment\n\n@experiment('probe')\ndef probe(params):\n    pass\n"
OFFLINE_CONFIG = "name: lab\nslurm:\n  login: {host: login.example, user: me}\n  workdir: /shared/me/hf\n  nodes: 2\n"
NODES = "name: lab\nnodes:\n  - {host: 10.0.0.1}\n  - {host: 10.0.0.2}\n  - {host: 10.0.0.3}\n  - {host: 10.0.0.4}\n"


def _backend(root: Path, extra: str = "", base: str = NODES):  # type: ignore[no-untyped-def]
    (root / "src").mkdir(exist_ok=True)
    (root / "src" / "probe.py").write_text(PROBE_EXPERIMENT)
    text = base + extra
    (root / "higgsfield.yml").write_text(text)
    return backend_for(parse_config(text, root / "higgsfield.yml"))


def _policy(plan) -> tuple[int, int, int, int]:  # type: ignore[no-untyped-def]
    return len(plan.nodes), plan.spares, plan.min_nodes, plan.max_recoveries


def test_without_the_keys_a_loss_fails_the_run_as_before(tmp_path: Path) -> None:
    assert _policy(_backend(tmp_path).plan(RunRequest("probe"))) == (4, 0, 0, 3)


def test_the_projects_policy_reaches_a_plan_and_the_flags_win(tmp_path: Path) -> None:
    backend = _backend(tmp_path, "min_nodes: 2\nspares: 1\nmax_recoveries: 5\n")
    assert _policy(backend.plan(RunRequest("probe"))) == (3, 1, 2, 5)   # 3 run, the 4th stands by
    assert _policy(backend.plan(RunRequest("probe", nodes=2))) == (2, 1, 0, 5)   # min_nodes >= size: every node
    flags = RunRequest("probe", min_nodes=1, spares=0, max_recoveries=0)
    assert _policy(backend.plan(flags)) == (4, 0, 1, 0)
    # a standing spares: 1 never refuses a run that claims every node: it has none to stand by
    assert _policy(backend.plan(RunRequest("probe", nodes=4))) == (4, 0, 2, 5)


def test_the_flags_that_do_not_fit_are_still_refused(tmp_path: Path) -> None:
    backend = _backend(tmp_path, "spares: 1\n")
    with pytest.raises(ConfigError, match=r"^--spares 1: the run's 4 node\(s\) and its spares are more than"):
        backend.plan(RunRequest("probe", nodes=4, spares=1))
    with pytest.raises(ConfigError, match=r"^--min-nodes 4: the run has 3 node\(s\)"):
        backend.plan(RunRequest("probe", min_nodes=4))


@pytest.mark.parametrize(("extra", "said"), [
    ("min_nodes: 5\n", r"min_nodes.*5 is more than the run's 4 node\(s\): give 1 to 4"),
    ("min_nodes: 0\n", r"min_nodes"),
    ("spares: 4\n", r"spares.*4 leaves no node of the 4 listed to run on: give 0 to 3"),
    ("spares: -1\n", r"spares"),
    ("max_recoveries: -1\n", r"max_recoveries"),
    ("max_recoveries: true\n", r"max_recoveries"),
])
def test_a_policy_that_cannot_work_names_its_field(tmp_path: Path, extra: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        parse_config(NODES + extra, tmp_path / "higgsfield.yml")


def test_on_slurm_min_nodes_and_max_recoveries_apply_and_spares_are_refused(tmp_path: Path) -> None:
    backend = _backend(tmp_path, "min_nodes: 1\nmax_recoveries: 2\n", base=OFFLINE_CONFIG)
    plan = backend.plan(RunRequest("probe"))
    assert (plan.min_nodes, plan.max_recoveries) == (1, 2)
    assert backend.plan(RunRequest("probe", min_nodes=2)).min_nodes == 0   # the flag wins: every node
    with pytest.raises(ConfigError, match=r"spares.*are for SSH nodes"):
        parse_config(OFFLINE_CONFIG + "spares: 1\n", tmp_path / "higgsfield.yml")


def test_run_refuses_a_bad_policy_in_one_line_exit_2(tmp_path: Path) -> None:
    _backend(tmp_path)
    (tmp_path / "higgsfield.yml").write_text(NODES + "spares: 9\n")
    proc = run_cli(tmp_path, "run", "probe")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "spares" in lines[0] and "higgsfield.yml" in lines[0], proc.stderr


def test_the_scaffolds_commented_policy_parses_when_uncommented(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, "init", "demo")
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "demo" / "higgsfield.yml"
    text = path.read_text()
    for key in ("min_nodes", "spares", "max_recoveries"):
        assert f"# {key}: " in text
        text = text.replace(f"# {key}: ", f"{key}: ")
    data = yaml.safe_load(text)
    data["nodes"] = [{"host": f"10.0.0.{i}"} for i in range(1, 4)]   # the scaffold lists one node
    cfg = parse_config(yaml.safe_dump(data), path)
    assert (cfg.min_nodes, cfg.spares, cfg.max_recoveries) == (2, 1, 3)


@pytest.mark.parametrize(("flags", "said"), [
    (["--nodes", "5"], "--nodes 5: the project has 4 node(s) in "),
    (["--spares", "4"], "--spares 4 leaves none of the 4 node(s) of "),
    (["--nodes", "4", "--spares", "1"], "--spares 1: the run's 4 node(s) and its spares are more than the 4 "),
    (["--min-nodes", "5"], "--min-nodes 5: the run has 4 node(s); give 1 to 4"),
])
def test_a_recovery_flag_that_does_not_fit_is_one_line_exit_2(tmp_path: Path, flags: list[str], said: str) -> None:
    _backend(tmp_path)
    proc = run_cli(tmp_path, "run", "probe", *flags)
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {said}"), (proc.returncode, proc.stderr)
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr

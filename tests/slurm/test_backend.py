"""The backend a project gets, the Slurm backend's plan and log tagging, and the login node's preflight answers.

Pure: a recording transport stands for the login node (the real one is the journey's,
tests/slurm/test_slurm_journey.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers_project import assert_one_line_error, run_cli, write

from higgsfield.contract.errors import ConfigError, ParamError, RunError
from higgsfield.contract.slurmjob import PinnedSlurmRun, pinned_json
from higgsfield.control.backends import RunRequest, backend_for
from higgsfield.control.backends.nodes.backend import NodesBackend
from higgsfield.control.backends.slurm import preflight as pf
from higgsfield.control.backends.slurm import template_spec
from higgsfield.control.backends.slurm.backend import SlurmBackend, SlurmSession
from higgsfield.control.backends.slurm.machines import parse_sinfo_nodes, sinfo_nodes_argv
from higgsfield.control.config import parse_config
from higgsfield.control.config.slurm import SlurmConfig
from higgsfield.control.remote.base import CommandResult

pytestmark = pytest.mark.timeout(60)

SLURM = """\
name: lab
slurm:
  login: {host: login.example, user: me}
  workdir: /shared/me/hf
  partition: debug
  account: testlab
  nodes: 2
  time: "10"
"""
NODES = "name: lab\nnodes:\n  - host: gpu-1\n"
EXPERIMENT = """\
from higgsfield.experiment import experiment, param

@experiment("probe")
@param("steps", default=1)
def probe(params):
    pass
"""


def project(tmp_path: Path, config: str) -> Any:
    write(tmp_path / "src" / "probe.py", EXPERIMENT)
    write(tmp_path / "higgsfield.yml", config)
    return parse_config(config, tmp_path / "higgsfield.yml")


def test_a_slurm_block_picks_the_slurm_backend(tmp_path: Path) -> None:
    assert isinstance(backend_for(project(tmp_path, SLURM)), SlurmBackend)
    assert isinstance(backend_for(project(tmp_path, NODES)), NodesBackend)
    assert isinstance(backend_for(project(tmp_path, SLURM + "nodes:\n  - host: gpu-1\n")), SlurmBackend)


def test_the_slurm_plan_takes_the_runs_overrides_and_checks_params_before_any_io(tmp_path: Path) -> None:
    backend = backend_for(project(tmp_path, SLURM))
    plan: Any = backend.plan(RunRequest("probe", {"steps": "3"}, run_name="r1", nodes=3, time="1:00:00",
                                        partition="big", max_restarts=2))
    assert (plan.run, plan.params, plan.max_restarts) == ("r1", {"steps": 3}, 2)
    assert (plan.settings.nodes, plan.settings.time, plan.settings.partition, plan.settings.account) == \
        (3, "1:00:00", "big", "testlab")
    with pytest.raises(ParamError):
        backend.plan(RunRequest("probe", {"steps": "many"}))
    with pytest.raises(ConfigError, match="^--time: "):
        backend.plan(RunRequest("probe", time="soon"))


def test_ssh_nodes_refuse_the_slurm_flags(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--partition is for a Slurm cluster"):
        backend_for(project(tmp_path, NODES)).plan(RunRequest("probe", partition="gpu"))


def test_run_with_a_bad_time_is_one_line_before_anything_connects(tmp_path: Path) -> None:
    project(tmp_path, SLURM)
    assert_one_line_error(run_cli(tmp_path, "run", "probe", "--time", "1h"),
                          "--time: '1h' is not a Slurm time limit: write minutes (90), HH:MM:SS (24:00:00) or "
                          "D-HH:MM:SS (2-00:00:00), quoted in YAML")


class Login:
    """A login node that answers ``cat`` of a run's files and streams given log lines."""

    node = "login"

    def __init__(self, files: dict[str, str], lines: list[str]) -> None:
        self.files, self.lines, self.calls = files, lines, []  # type: ignore[var-annotated]

    async def run(self, argv: Sequence[str], **kw: Any) -> CommandResult:
        self.calls.append(list(argv))
        name = argv[-1].rsplit("/", 1)[-1]
        if argv[0] == "cat" and name in self.files:
            return CommandResult("login", tuple(argv), 0, self.files[name])
        return CommandResult("login", tuple(argv), 1, "", "No such file")

    async def stream(self, argv: Sequence[str], **kw: Any) -> AsyncIterator[str]:
        self.calls.append(list(argv))
        for line in self.lines:
            yield line


def _pinned(nodes: tuple[str, ...], nproc: int) -> str:
    """The ``spec.json`` a job pins to its allocation (``nodes`` in SLURM_NODEID order)."""
    spec = template_spec(project="lab", experiment="probe", run="r", module="probe", code_dir="/c", params={})
    return json.dumps(pinned_json(PinnedSlurmRun(replace(spec, node=nodes[0], nodes=nodes, master_addr=nodes[0],
                                                         nproc=nproc))))


def test_log_lines_are_tagged_node_slash_rank_from_the_allocation(tmp_path: Path) -> None:
    cfg = project(tmp_path, SLURM)
    login = Login({"run.json": '{"state": "succeeded"}', "spec.json": _pinned(("n2", "n1"), 2)},
                  ["0\tr0", "3\tr3", "-1\ttorchrun says", "#hb", "2\tr2"])
    session = SlurmSession(cfg, cfg.slurm, login)  # type: ignore[arg-type]

    async def collect(**kw: Any) -> list[tuple[str, int, str]]:
        return [(ln.node, ln.rank, ln.text) async for ln in session._lines("r", follow=False, **kw)]

    # torchrun's c10d rendezvous ranks the nodes by name (--local_addr): n1 holds ranks 0-1, whatever the order
    assert asyncio.run(collect()) == [("n1", 0, "r0"), ("n2", 3, "r3"), ("slurm", -1, "torchrun says"),
                                      ("n2", 2, "r2")]
    assert asyncio.run(collect(node="n1")) == [("n1", 0, "r0")]
    asyncio.run(collect(ranks=(3,), since=5.0))   # the login node's invoker filters: it is asked to
    argv = login.calls[-1]
    assert argv[:2] == ["/shared/me/hf/venv/bin/python", "-m"] and argv[-4:] == ["--since", "5.0", "--rank", "3"]
    # a spec.json that does not decode (cut short, not the job's) places no rank: every line is the job's own
    login.files["spec.json"] = '{"nodes": ["n2", "n1"], "nproc": 2}'
    assert {node for node, _, _ in asyncio.run(collect())} == {"slurm"}


SINFO = """\
debug*|up|idle|2|(null)
debug*|up|alloc|1|(null)
gpu|up|idle|1|gpu:a100:8(S:0-1)
gpu|up|mix|3|gpu:8,shard:16
"""


def test_sinfo_gives_partitions_idle_nodes_and_gpus() -> None:
    parts = {p.name: p for p in pf.parse_sinfo(SINFO)}
    assert (parts["debug"].default, parts["debug"].nodes, parts["debug"].idle, parts["debug"].gpus) == \
        (True, 3, 2, 0)
    assert (parts["gpu"].nodes, parts["gpu"].idle, parts["gpu"].gpus) == (4, 1, 32)
    assert parts["gpu"].describe() == "gpu: 4 nodes, 1 idle, 32 GPUs"


SINFO_NODES = """\
n1|idle|2|0.05|1000|800|(null)|none
n2|mixed|2|1.50|1000|N/A|gpu:a100:4(S:0-1),shard:8|none
n3|down*|2|N/A|1000|N/A|gpu:2|Not responding
n4|drained|8|0.00|64000|60000|gpu:8|disk swap | ticket 12
n1|idle|2|0.05|1000|800|(null)|none
"""


def test_sinfo_nodes_give_each_node_once_with_state_load_memory_gpus_and_reason() -> None:
    nodes = {n.name: n for n in parse_sinfo_nodes(SINFO_NODES)}
    assert list(nodes) == ["n1", "n2", "n3", "n4"]          # a node in two partitions: once
    n1, n2, n3, n4 = nodes.values()
    assert (n1.state, n1.usable, n1.cpus, n1.cpu_load, n1.memory_mib, n1.free_mib, n1.gpus, n1.gres, n1.reason) == \
        ("idle", True, 2, 0.05, 1000, 800, 0, "", None)
    assert (n2.state, n2.usable, n2.cpu_load, n2.free_mib, n2.gpus) == ("mixed", True, 1.5, None, 4)
    assert (n3.state, n3.responding, n3.usable, n3.cpu_load, n3.reason) == ("down", False, False, None,
                                                                           "Not responding")
    assert (n4.usable, n4.gpus, n4.reason) == (False, 8, "disk swap | ticket 12")   # free text, '|' and all
    assert sinfo_nodes_argv("gpu")[-2:] == ["-p", "gpu"] and "-p" not in sinfo_nodes_argv(None)


def test_a_bad_partition_or_account_is_one_line_naming_the_field() -> None:
    s = SlurmConfig.model_validate({"login": "h", "workdir": "/w", "partition": "nope", "account": "ghost"})
    f = pf.partition(s, pf.parse_sinfo(SINFO))
    assert not f.ok and f.problem == "partition 'nope' does not exist on the cluster (partitions: debug, gpu)"
    assert f.fix is not None and "slurm.partition" in f.fix
    sub = pf.submit(s, False, "", "sbatch: error: Batch job submission failed: Invalid account or "
                                  "account/partition combination specified\n")
    assert not sub.ok and sub.problem == ("Slurm refuses account 'ghost' on partition 'nope': Invalid account or "
                                          "account/partition combination specified")
    assert sub.fix is not None and "slurm.account" in sub.fix
    missing = pf.commands("/usr/bin/sbatch\n/usr/bin/srun\n")
    assert not missing.ok and missing.summary == "missing squeue, scancel, sinfo"


def test_the_test_only_job_is_shaped_like_a_run() -> None:
    s = SlurmConfig.model_validate({"login": "h", "workdir": "/w", "partition": "debug", "account": "lab",
                                    "nodes": 2, "gpus_per_node": 8, "time": "10", "extra": ["--qos=high"]})
    argv = pf.test_only_argv(s)
    assert argv[:3] == ("sbatch", "--test-only", "--nodes=2")
    assert {"--gpus-per-node=8", "--partition=debug", "--account=lab", "--time=10", "--qos=high"} <= set(argv)
    assert argv[-2:] == ("--wrap", "true")


def test_which_finds_every_command_in_sh(tmp_path: Path) -> None:
    """The login node's /bin/sh may be dash, whose 'command -v' reads only its first argument."""
    import os
    import subprocess

    for c in pf.COMMANDS:
        (tmp_path / c).write_text("#!/bin/sh\n")
        (tmp_path / c).chmod(0o755)
    out = subprocess.run(list(pf.WHICH), capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}).stdout
    assert pf.commands(out).ok, out


class Deployed(Login):
    """A login node where the project is deployed (``code`` resolves), with the given files."""

    async def run(self, argv: Sequence[str], **kw: Any) -> CommandResult:
        if argv[0] == "readlink":
            return CommandResult("login", tuple(argv), 0, "/shared/me/hf/projects/lab/releases/abc\n")
        return await super().run(argv, **kw)


@pytest.mark.parametrize(("env", "python"), [
    ('{"key": "k1", "dir": "/e/k1", "python": "/e/k1/bin/python", "torch": "2.6.0", "built_at": 1.0}',
     "/e/k1/bin/python"),
    (None, None), ("not json", None), ('["/e/k1/bin/python"]', None), ('{"python": 3}', None), ("{}", None),
])
def test_the_project_environment_is_read_from_its_record(tmp_path: Path, env: str | None,
                                                          python: str | None) -> None:
    cfg = project(tmp_path, SLURM)
    session = SlurmSession(cfg, cfg.slurm, Deployed({} if env is None else {"env.json": env}, []))  # type: ignore[arg-type]
    if python is not None:
        assert asyncio.run(session._deployed()) == ("/shared/me/hf/projects/lab/releases/abc", python)
        return
    with pytest.raises(RunError) as e:   # absent or damaged: as none, the same one line
        asyncio.run(session._deployed())
    assert str(e.value) == ("project 'lab' has no project environment in /shared/me/hf on login: run 'higgsfield "
                            "deploy' (it builds one from requirements.txt)")


def test_the_dashboards_slurm_queue_entries_are_typed(tmp_path: Path) -> None:
    """The node view's queue of a Slurm cluster is QueueEntry, as the SSH nodes' is: the pending run waits
    with no slot count (the page says 'an allocation' and the run's reason), the running one holds each of
    its nodes without slots counted (the page says 'the node')."""
    from higgsfield.contract.codec import decode
    from higgsfield.contract.feed import QueueEntry
    from higgsfield.contract.nodepart import NodePart
    from higgsfield.control.backends.nodes import RunStatus
    from higgsfield.control.backends.slurm import ClusterNode

    fleet: Any = backend_for(project(tmp_path, SLURM)).fleet(lambda kind: None)
    fleet._runs = [RunStatus("lab", "probe", "long", "running", {"n1": NodePart("running")}, 1.0),
                   RunStatus("lab", "probe", "wait", "queued", {}, 2.0, reason="Resources")]
    fleet._machines = [ClusterNode("n1", "allocated", cpus=4), ClusterNode("n2", "idle", cpus=4)]
    login, n1, n2 = fleet.nodes()
    queues = [login["queue"], n1["queue"], n2["queue"]]
    for q in queues:
        assert [decode(QueueEntry, e) for e in q] == [QueueEntry(**e) for e in q]   # each decodes, unchanged
    assert queues == [[{"project": "lab", "run": "wait", "want": None, "slots": None, "committed": False}],
                      [{"project": "lab", "run": "long", "want": None, "slots": [], "committed": True}], []]

"""`higgsfield prune` on a localhost node: real records on disk, a real running process, the real CLI.

The state dir holds finished runs of various ages, a running run (a real sleeping process
recorded as its supervisor), a queued run, a damaged record and a symlinked run directory;
checkpoints live under the node's cache dir (HOME points into the test's directory).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import RunDir, RunRecord

PROJECT = "pruneproj"
DAY = 86400.0
# name -> (state, days since it ended (or was made, for an active run))
RUNS = {"old1": ("succeeded", 40), "old2": ("failed", 35), "mid": ("killed", 2), "new": ("succeeded", 0.01),
        "running": ("running", 50), "queued": ("queued", 50)}


@pytest.fixture()
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    yield p
    p.kill()
    p.wait(10)


@pytest.fixture()
def node(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> Path:
    """A project on localhost and its node's state: the runs of RUNS, a damaged one, a linked one."""
    proj = tmp_path / "proj"
    proj.mkdir()
    write_config(proj, "")
    state, now = tmp_path / "state", time.time()
    for name, (st, days) in RUNS.items():
        rd = RunDir(NodeState(state), PROJECT, name)
        rd.make()
        active = st in ("running", "queued")
        rd.write(RunRecord(PROJECT, "exp", name, "localhost", 0, 1, 1, state=st, created_at=now - days * DAY,
                           ended_at=None if active else now - days * DAY,
                           pids={"supervisor": sleeper.pid} if st == "running" else {}))
        rd.rank_log(0).write_text("loss 1.0\n" * 2000)
        ckpt = checkpoints(tmp_path, name)
        ckpt.mkdir(parents=True)
        (ckpt / "shard0.distcp").write_bytes(b"\0" * 50_000)
    bad = RunDir(NodeState(state), PROJECT, "damaged")
    bad.make()
    bad.record_path.write_text('{"state": "succ')     # a crash or another tool left this
    RunDir(NodeState(tmp_path / "outside"), PROJECT, "x").write(   # a finished, old run reached through a link
        RunRecord(PROJECT, "exp", "linked", "localhost", 0, 1, 1, state="succeeded", ended_at=now - 90 * DAY))
    (state / "runs" / PROJECT / "linked").symlink_to(tmp_path / "outside" / "runs" / PROJECT / "x")
    return tmp_path


def write_config(proj: Path, extra: str) -> None:
    (proj / "higgsfield.yml").write_text(f"name: {PROJECT}\nnodes:\n  - host: localhost\nruntime: process\n"
                                         f"state_dir: {proj.parent / 'state'}\n{extra}")


def checkpoints(root: Path, run: str) -> Path:
    return root / "home" / ".cache" / "higgsfield" / PROJECT / "experiments" / "exp" / run


def hf(root: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=root / "proj", capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "HOME": str(root / "home")})


def listed(out: str) -> set[str]:
    """The runs a prune's output names as removed (or to be removed)."""
    return set(re.findall(r"^  run (\S+) \(", out, re.M))


def present(root: Path) -> set[str]:
    return {p.name for p in (root / "state" / "runs" / PROJECT).iterdir()}


def one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr


@pytest.mark.timeout(120)
def test_dry_run_lists_exactly_what_prune_removes_and_active_runs_stay(
        node: Path, sleeper: subprocess.Popen[bytes]) -> None:
    before = present(node)
    dry = hf(node, "prune", "--dry-run", "--older-than", "30d")
    assert dry.returncode == 0, dry.stderr
    assert listed(dry.stdout) == {"old1", "old2"}
    assert "would remove 2 run(s), 0 checkpoint dir(s)" in dry.stdout
    assert "skipped runs/pruneproj/damaged/run.json" in dry.stdout   # named, never removed
    assert "runs/pruneproj/linked: a symlink (not followed)" in dry.stdout
    assert present(node) == before                                   # a dry run removes nothing

    real = hf(node, "prune", "--older-than", "30d")
    assert real.returncode == 0, real.stderr
    assert listed(real.stdout) == listed(dry.stdout)
    assert before - present(node) == {"old1", "old2"}
    assert {"running", "queued", "damaged", "linked", "mid", "new"} <= present(node)
    assert sleeper.poll() is None                                    # the running run's process is untouched
    assert checkpoints(node, "old1").is_dir() and checkpoints(node, "old2").is_dir()  # never without asking
    assert (node / "outside" / "runs" / PROJECT / "x" / "run.json").is_file()         # the link's target stays
    freed = re.search(r"^freed (\S+ \S+) on 1 node\(s\)$", real.stdout, re.M)
    assert freed and freed.group(1) != "0 B", real.stdout

    again = hf(node, "prune", "--older-than", "30d")                 # nothing left to remove
    assert again.returncode == 0 and listed(again.stdout) == set(), again.stdout


@pytest.mark.timeout(120)
def test_run_and_checkpoints_only_when_asked(node: Path) -> None:
    r = hf(node, "prune", "--run", "mid", "--checkpoints", "--dry-run")
    assert r.returncode == 0 and listed(r.stdout) == {"mid"}, r.stdout
    assert f"checkpoints {checkpoints(node, 'mid')}" in r.stdout
    r = hf(node, "prune", "--run", "mid", "--checkpoints")
    assert r.returncode == 0 and listed(r.stdout) == {"mid"}, r.stdout
    assert "mid" not in present(node) and not checkpoints(node, "mid").exists()
    assert checkpoints(node, "new").is_dir() and checkpoints(node, "running").is_dir()
    # --run with --older-than: only if that run is older too
    r = hf(node, "prune", "--run", "new", "--older-than", "1d")
    assert r.returncode == 0 and listed(r.stdout) == set() and "new" in present(node), r.stdout


@pytest.mark.timeout(120)
def test_retention_keep_runs_and_max_age(node: Path) -> None:
    write_config(node / "proj", "retention:\n  keep_runs: 2\n  images: false\n")
    r = hf(node, "prune", "--dry-run")
    assert r.returncode == 0 and listed(r.stdout) == {"old1", "old2"}, r.stdout   # the 2 newest finished stay
    write_config(node / "proj", "retention:\n  keep_runs: 1\n  max_age: 1d\n  checkpoints: true\n  images: false\n")
    r = hf(node, "prune")
    assert r.returncode == 0 and listed(r.stdout) == {"old1", "old2", "mid"}, r.stdout
    assert present(node) == {"new", "running", "queued", "damaged", "linked"}
    assert not checkpoints(node, "old1").exists() and checkpoints(node, "new").is_dir()


@pytest.mark.timeout(120)
def test_bad_input_is_one_line_exit_2(node: Path) -> None:
    before = present(node)
    one_line_error(hf(node, "prune", "--older-than", "soon"), "'soon' is not a duration")
    one_line_error(hf(node, "prune", "--run", "nosuch"), "no run named 'nosuch' on any node")
    one_line_error(hf(node, "prune", "--run", "running"), "run 'running' is running on localhost",
                   "higgsfield kill running")
    one_line_error(hf(node, "prune", "--run", "queued", "--run", "old1"), "run 'queued' is queued")
    one_line_error(hf(node, "prune", "--run", "../x"), "not a run or experiment name")
    one_line_error(hf(node, "prune"), "nothing to prune by")
    write_config(node / "proj", "retention:\n  max_age: 30x\n")
    one_line_error(hf(node, "prune"), "retention.max_age", "'30x' is not a duration above zero")
    write_config(node / "proj", "retention:\n  keep_runs: -1\n")
    one_line_error(hf(node, "prune"), "retention.keep_runs")
    assert present(node) == before                   # no refused prune removed anything (not even old1)
    bad = subprocess.run([sys.executable, "-m", "higgsfield", "invoker", "--state-dir", str(node / "state"), "prune",
                          "--project", PROJECT], input='{"keep_runs": "all"}', capture_output=True, text=True,
                         timeout=60)
    one_line_error(bad, "'keep_runs' 'all' is not a count")


class _Unreachable:
    """A node whose connection is gone: what a deploy's prune meets when a node drops right after deploying."""

    node = "localhost"

    async def run(self, argv: Sequence[str], **kw: object) -> object:
        from higgsfield.contract.errors import ConnectError

        raise ConnectError("localhost", "connection lost")


@pytest.mark.timeout(120)
def test_deploy_hook_prunes_by_retention_and_a_failure_only_warns(node: Path) -> None:
    from higgsfield.control.backends.nodes.prune import apply_retention
    from higgsfield.control.config import load_config
    from higgsfield.control.remote import open_group

    write_config(node / "proj", "retention:\n  max_age: 30d\n  images: false\n")
    cfg = load_config(node / "proj" / "higgsfield.yml")

    async def go() -> str | None:
        async with open_group(cfg) as group:
            return await apply_retention(group.members[0].transport, cfg)

    os.environ["HOME"], home = str(node / "home"), os.environ["HOME"]
    try:
        line = asyncio.run(go())
    finally:
        os.environ["HOME"] = home
    assert line is not None and line.startswith("retention: removed 2 run(s), 0 checkpoint dir(s), 0 image(s)")
    assert not {"old1", "old2"} & present(node)
    warning = asyncio.run(apply_retention(_Unreachable(), cfg))  # type: ignore[arg-type]
    assert warning == "warning: retention: the prune failed: localhost: connection lost"
    write_config(node / "proj", "")
    assert asyncio.run(apply_retention(_Unreachable(), load_config(node / "proj" / "higgsfield.yml"))) is None  # type: ignore[arg-type]


@pytest.mark.timeout(120)
def test_doctor_shows_usage_and_warns_below_10_percent_free(node: Path) -> None:
    import json

    from higgsfield.control import doctor
    from higgsfield.control.config import Config
    from higgsfield.control.remote.base import CommandResult

    r = hf(node, "doctor", "--json")
    usage = json.loads(r.stdout)["nodes"][0]["checks"]["usage"]
    assert usage["data"]["state_bytes"] > 6 * 16_000 and usage["data"]["checkpoint_bytes"] >= 6 * 50_000, usage
    assert re.fullmatch(r"state \S+ \S+, checkpoints \S+ \S+, \S+ \S+ free", usage["summary"]), usage
    assert usage["data"]["free"][0]["free_bytes"] > 0
    r = hf(node, "doctor")
    assert "disk usage" in r.stdout and "checkpoints" in r.stdout, r.stdout

    cfg = Config.model_validate({"name": PROJECT, "nodes": [{"host": "gpu-1"}]})
    argv = doctor._usage_argv(cfg, cfg.nodes[0])
    answer = {"state_bytes": 10, "checkpoint_bytes": 20, "free": [
        {"what": "state", "path": "/home/u/.higgsfield", "free_bytes": 5 << 30, "total_bytes": 100 << 30}]}
    low = doctor._usage(cfg, cfg.nodes[0], doctor.Facts("n", {argv: CommandResult("n", argv, 0, json.dumps(answer), "")}))
    assert not low.ok and "less than 10% free for state (/home/u/.higgsfield: 5.0 of 100 GiB)" in (low.problem or "")
    assert (low.fix or "").startswith("higgsfield prune --dry-run")
    assert not doctor._usage(cfg, cfg.nodes[0], doctor.Facts("n", {})).ok      # an invoker without the verb


@pytest.mark.timeout(60)
def test_the_prune_request_reads_back_as_sent_and_an_unknown_field_is_named() -> None:
    """One PrunePolicy on both sides: what the control side sends is what the node plans from."""
    import json

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from higgsfield.contract.prunespec import PruneError, PrunePolicy, read_policy

    names = st.from_regex(r"[a-z][a-z0-9_-]{0,20}", fullmatch=True)

    @settings(max_examples=200, deadline=None)
    @given(st.builds(PrunePolicy, older_than_s=st.none() | st.floats(0, 1e9), keep_runs=st.none() | st.integers(0, 10**6),
                     runs=st.lists(names, max_size=4).map(tuple), checkpoints=st.booleans(), images=st.booleans(),
                     dry_run=st.booleans()))
    def round_trip(policy: PrunePolicy) -> None:
        assert read_policy(json.loads(policy.to_json())) == policy

    round_trip()
    with pytest.raises(PruneError, match=r"unknown field\(s\) 'keep_last'.*higgsfield setup --step invoker"):
        read_policy({"keep_last": 3})

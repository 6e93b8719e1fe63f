"""``higgsfield stacks`` and the stall in ``status`` / ``status --json``, on a ``localhost`` node (no SSH).

Runs that stalled are real records and real saved stacks in the node's state
directory (written by the node's own ``records`` and ``runs.stacks.save``), read
back through the real ``invoker status`` / ``invoker stacks``; a live run is a real
torchrun of two ranks, whose stacks are taken now (each rank dumps its own: no ptrace).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers_project import local_project

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.replies import StacksReply
from higgsfield.contract.stacks import Frame, RankStacks, Thread, diagnose

pytestmark = pytest.mark.timeout(120)

HANG = '''
import time
from higgsfield.experiment import experiment, param


def wait_for_the_data(seconds):
    time.sleep(seconds)


@experiment("hang")
@param("sleep", default=120.0)
def hang(params):
    print(f"hang rank {params.rank} up", flush=True)
    wait_for_the_data(params.sleep)
'''

SRC = "/home/u/proj/src/train.py"
TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def _stacks(node: str) -> list[RankStacks]:
    """Rank 0 waits in all_reduce at train.py:88; rank 1 sleeps in the data loader at data.py:17."""
    waiting = Thread("MainThread", (Frame("<module>", SRC, 120), Frame("train", SRC, 88, "dist.all_reduce(loss)"),
                                    Frame("all_reduce", TORCH, 2501)))
    asleep = Thread("MainThread", (Frame("<module>", SRC, 120), Frame("train", SRC, 80),
                                   Frame("next_batch", "/home/u/proj/src/data.py", 17, "time.sleep(3600)")))
    return [RankStacks(node, 0, 4100, (waiting,)), RankStacks(node, 1, 4101, (asleep,), native="Thread 4101 (idle)")]


def _record(run: str, state: str, now: float, **extra: object) -> dict[str, object]:
    return {"project": "stackproj", "experiment": "hang", "run": run, "node": "localhost", "node_rank": 0,
            "nnodes": 1, "nproc": 2, "state": state, "created_at": now - 600, "started_at": now - 590, **extra}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from higgsfield.node.runs.stacks import save
    from higgsfield.node.state.home import NodeState
    from higgsfield.node.state.records import RunDir

    root = tmp_path_factory.mktemp("stacks")
    proj = local_project(root, "stackproj", {"hang.py": HANG}, nproc=2)
    state = root / "state"
    now = time.time()
    stacks = _stacks("localhost")
    diagnosis = diagnose(stacks)
    stall = {"stall": encode(diagnosis), "stalled_at": now - 60}
    records = {
        "hang-wait": _record("hang-wait", "stalled", now, **stall),
        "hang-fail": _record("hang-fail", "failed", now, ended_at=now - 55, exit_code=1, failed_node="localhost",
                             failed_rank=1, failed_at=now - 60, reason=f"stalled: {diagnosis.summary}", **stall),
        "done": _record("done", "succeeded", now, ended_at=now - 100, exit_code=0),
    }
    for run, record in records.items():
        rd = RunDir(NodeState(state), "stackproj", run)
        rd.make()
        (rd.path / "run.json").write_text(json.dumps(record))
        if "stall" in record:
            save(rd, stacks)
    return proj


def hf(project: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "TERM": "dumb"}
    return subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=project, capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_status_shows_a_stalled_run_and_a_run_failed_by_its_stall(project: Path) -> None:
    r = hf(project, "status")
    assert r.returncode == 0, r.stderr
    wait = next(line for line in r.stdout.splitlines() if line.startswith("hang-wait "))
    assert " stalled " in wait
    summary = "localhost/0 waits in all_reduce at train.py:88; localhost/1 is at data.py:17 `time.sleep(3600)`"
    assert f"hang-wait: stalled:\n  stalled: {summary}\n" in r.stdout, r.stdout
    assert f"hang-fail: first failure on localhost rank 1:\n  stalled: {summary}\n" in r.stdout, r.stdout
    assert "    odd: localhost/1 at data.py:17 `time.sleep(3600)`" in r.stdout
    assert "every rank's stack at the stall: higgsfield stacks hang-fail" in r.stdout


def test_status_json_carries_the_diagnosis(project: Path) -> None:
    r = hf(project, "status", "--json")
    assert r.returncode == 0, r.stderr
    runs = {x["run"]: x for x in json.loads(r.stdout)["runs"]}
    for name in ("hang-wait", "hang-fail"):
        stall = runs[name]["stall"]
        assert stall["odd"] == ["localhost/1"] and stall["groups"][0]["ranks"] == ["localhost/0"]
        assert stall["summary"].startswith("localhost/0 waits in all_reduce at train.py:88")
        assert isinstance(runs[name]["stalled_at"], float)
    assert runs["hang-wait"]["state"] == "stalled"
    assert runs["hang-fail"]["reason"].startswith("stalled: localhost/0 waits in all_reduce")
    assert runs["done"]["stall"] is None and runs["done"]["stalled_at"] is None


def test_stacks_of_a_stalled_run_are_the_saved_ones(project: Path) -> None:
    r = hf(project, "stacks", "hang-fail")
    assert r.returncode == 0, r.stderr
    assert "hang-fail (failed): 2 rank(s), stacks saved at its stall" in r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("localhost/0 waits in all_reduce at train.py:88; localhost/1 is at data.py:17")
    assert "group 2 (odd, 1 rank): localhost/1 at data.py:17 `time.sleep(3600)`" in lines
    assert "== localhost/1 (pid 4101) ==" in lines and "  native (py-spy):" in lines
    assert "      time.sleep(3600)" in lines
    # --json: the shape, innermost frame last
    j = hf(project, "stacks", "hang-fail", "--json")
    assert j.returncode == 0, j.stderr
    data = json.loads(j.stdout)
    assert [(s["node"], s["rank"], s["pid"]) for s in data] == [("localhost", 0, 4100), ("localhost", 1, 4101)]
    assert set(data[0]) == {"node", "rank", "pid", "threads"}
    frames = data[0]["threads"][0]["frames"]
    assert frames[-1] == {"function": "all_reduce", "file": TORCH, "line": 2501}
    one = json.loads(hf(project, "stacks", "hang-wait", "--rank", "1", "--node", "localhost", "--json").stdout)
    assert [s["rank"] for s in one] == [1] and one[0]["threads"][0]["frames"][-1]["function"] == "next_batch"


def test_stacks_refuses_a_run_without_any_in_one_line(project: Path) -> None:
    r = hf(project, "stacks", "done")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("error: run 'done' is succeeded, not running, and saved no stacks (only a run that "
                        "stalled keeps them)\n")
    r = hf(project, "stacks", "nosuch")
    assert r.returncode == 2 and r.stderr.startswith("error: no run") and r.stderr.count("\n") == 1
    r = hf(project, "stacks", "hang-fail", "--node", "gpu-9")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "gpu-9" in r.stderr
    r = hf(project, "stacks", "hang-fail", "--rank", "7")
    assert r.returncode == 2 and r.stderr == "error: run 'hang-fail' has no rank 7 with a stack (it is failed)\n"


def test_run_refuses_bad_stall_flags(project: Path) -> None:
    for args, word in ((["--on-stall", "retry"], "--on-stall"), (["--stall-timeout", "-1"], "--stall-timeout"),
                       (["--startup-timeout", "soon"], "--startup-timeout")):
        r = hf(project, "run", "hang", *args)
        assert r.returncode == 2 and word in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


def test_the_stacks_reply_is_typed_and_versioned() -> None:
    reply = StacksReply(run="r1", state="running", ranks=_stacks("n1"), saved=False)
    wire = json.loads(json.dumps(encode(reply)))
    assert wire["version"] == 1 and wire["ranks"][1]["threads"][0]["frames"][-1]["code"] == "time.sleep(3600)"
    assert decode(StacksReply, wire) == reply
    with pytest.raises(DecodeError, match="version 2"):
        decode(StacksReply, {**wire, "version": 2})
    with pytest.raises(DecodeError, match=r"'ranks\[0\]\.pid' must be an integer"):
        decode(StacksReply, {**wire, "ranks": [{**wire["ranks"][0], "pid": "x"}]})
    with pytest.raises(DecodeError, match="'state'"):
        decode(StacksReply, {**wire, "state": "sleeping"})


# -- a live run: its stacks taken now -------------------------------------------------------------

@pytest.fixture(scope="module")
def live(project: Path) -> Iterator[str]:
    r = hf(project, "run", "hang", "--run-name", "hang-live", "-d", "--stall-timeout", "0",
           "--startup-timeout", "100", "--on-stall", "wait", timeout=90)
    assert r.returncode == 0, r.stderr
    logs = project.parent / "state" / "runs" / "stackproj" / "hang-live" / "logs"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = "".join(p.read_text(errors="replace") for p in logs.glob("rank*.log")) if logs.is_dir() else ""
        if "hang rank 0 up" in text and "hang rank 1 up" in text:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the ranks did not come up: {text!r}")
    yield "hang-live"
    hf(project, "kill", "hang-live")


@pytest.mark.slow   # a real torchrun of 2 ranks: make test runs it, make test-fast does not
def test_stacks_of_a_live_run_name_every_rank(project: Path, live: str) -> None:
    spec = json.loads((project.parent / "state" / "runs" / "stackproj" / live / "spec.json").read_text())
    assert (spec["stall_timeout"], spec["startup_timeout"], spec["on_stall"]) == (0.0, 100.0, "wait")
    t0 = time.monotonic()
    r = hf(project, "stacks", live)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert "hang-live (running): 2 rank(s), stacks taken now" in r.stderr
    assert r.stdout.startswith("localhost/0, localhost/1 are at hang.py:")   # one group: both in the same line
    assert "== localhost/0 (pid " in r.stdout and "== localhost/1 (pid " in r.stdout
    assert "in wait_for_the_data" in r.stdout and "time.sleep(seconds)" in r.stdout
    assert took < 10, took
    data = json.loads(hf(project, "stacks", live, "--json").stdout)
    assert sorted(s["rank"] for s in data) == [0, 1]
    for s in data:
        main = next(t for t in s["threads"] if t["name"] == "MainThread")
        assert main["frames"][-1]["function"] == "wait_for_the_data", main

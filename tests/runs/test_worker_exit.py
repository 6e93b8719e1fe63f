"""How a rank ends, as the entrypoint runs it (``python -m higgsfield.node.entrypoint RUN_DIR``, real processes):
a clean exit leaves ``rank<N>.done`` after joining threads and running exit hooks; an exception, a SIGABRT
or a SIGKILL leaves ``rank<N>.error.json`` with the moment it failed (the tee records deaths); and what a
node reports as its failure (:mod:`higgsfield.node.runs.failure`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from higgsfield.contract.codec import encode
from higgsfield.contract.runspec import RunSpec
from higgsfield.node.runs import failure
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import RunDir

REPO = Path(__file__).resolve().parents[2]

ENDINGS = '''
import atexit, os, signal, sys, threading, time
from higgsfield.experiment import experiment, param

@experiment("ending")
@param("how", default="clean")
def ending(params):
    print("started", flush=True)
    if params.how == "clean":
        atexit.register(lambda: print("atexit hook ran", flush=True))
        def late():
            time.sleep(0.5)
            print("non-daemon thread finished", flush=True)
        threading.Thread(target=late).start()
    elif params.how == "gloo":
        import torch, torch.distributed as dist
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)   # imports torch._dynamo: keeps the group
        x = torch.ones(4)
        dist.all_reduce(x)
        print(f"all_reduce {x.tolist()}", flush=True)
    elif params.how == "raise":
        raise ValueError("bad value")
    elif params.how == "abort":
        os.abort()
    elif params.how == "kill9":
        os.kill(os.getpid(), signal.SIGKILL)
'''


def _run(tmp_path: Path, how: str) -> tuple[int, RunDir, float]:
    code = tmp_path / "code"
    (code / "src").mkdir(parents=True, exist_ok=True)
    (code / "src" / "ending.py").write_text(ENDINGS)
    rd = RunDir(NodeState(tmp_path / "state"), "p", how)
    rd.make()
    rd.spec_path.write_text(json.dumps(encode(RunSpec(
        project="p", experiment="ending", run=how, module="ending", code_dir=str(code), params={"how": how},
        node="n", node_rank=0, nodes=("n",), master_addr="127.0.0.1", submitted_at=time.time()))))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PROJECT_NAME="p", EXPERIMENT_NAME="ending", RUN_NAME=how, PYTHONPATH=str(REPO))
    t0 = time.time()
    rc = subprocess.run([sys.executable, "-m", "higgsfield.node.entrypoint", str(rd.path)], env=env,  # noqa: S603
                        timeout=120).returncode
    deadline = time.time() + 10   # the tee writes a death's record as it drains
    while time.time() < deadline and not list(rd.logs.glob("rank0.*.json")) and how not in ("clean", "gloo"):
        time.sleep(0.05)
    return rc, rd, t0


@pytest.mark.parametrize("how", ["clean", "gloo"])
def test_a_finished_rank_joins_threads_runs_exit_hooks_and_leaves_done(tmp_path: Path, how: str) -> None:
    rc, rd, _ = _run(tmp_path, how)
    log = rd.rank_log(0).read_text()
    assert rc == 0, log
    if how == "clean":
        assert "non-daemon thread finished" in log and "atexit hook ran" in log
    else:
        assert "all_reduce [1.0, 1.0, 1.0, 1.0]" in log and "terminate called" not in log
    assert (rd.logs / "rank0.done").read_text() == "0" and not rd.rank_error(0).exists()
    assert {oct(p.stat().st_mode & 0o777) for p in rd.logs.iterdir()} == {"0o600"}


@pytest.mark.parametrize("how,kind,rc", [("raise", "exception", 1), ("abort", "died", -signal.SIGABRT),
                                         ("kill9", "died", -signal.SIGKILL)])
def test_a_failing_rank_leaves_when_and_how_it_failed(tmp_path: Path, how: str, kind: str, rc: int) -> None:
    got, rd, t0 = _run(tmp_path, how)
    assert got == rc
    error = json.loads(rd.rank_error(0).read_text())
    assert error["kind"] == kind and error["rank"] == 0 and t0 <= error["time"] <= time.time()
    assert not (rd.logs / "rank0.done").exists()
    if how == "raise":
        assert error["error"] == "ValueError: bad value"
    # what the node reports: the rank, when, why, and the end of its log
    summary = f"Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : {rc}\n"
    (rd.logs / "launcher.log").write_text(summary)
    f = failure.describe(rd, "n1", 1, since=t0)
    assert (f.node, f.rank, f.at) == ("n1", 0, error["time"])
    expected = {"raise": "rank 0: ValueError: bad value", "abort": "rank 0 was killed by SIGABRT",
                "kill9": "rank 0 was killed by SIGKILL (out of memory?)"}[how]
    assert f.reason == expected and "started" in f.tail
    assert failure.describe(rd, "n1", 1, since=time.time() + 60).rank == 0   # older errors: the summary's rank


def test_a_node_whose_torchrun_died_reports_torchrun(tmp_path: Path) -> None:
    rd = RunDir(NodeState(tmp_path), "p", "r")
    rd.make()
    (rd.logs / "launcher.log").write_text("[higgsfield] ...\n")
    f = failure.describe(rd, "n2", 137, since=0)
    assert f.rank is None and f.reason == "torchrun was killed by SIGKILL (out of memory?)"
    assert failure.exit_words(-11) == "was killed by SIGSEGV" and failure.exit_words(3) == "exited 3"

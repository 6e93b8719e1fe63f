"""A run's name is its own: a start refused because the name is in use never touches the run holding it.

Local (one ``localhost`` node, process runtime, real torchrun): the second start of a name,
one after the other or both at once, is refused in one line (exit 2) and the first run
finishes ``succeeded``; a failed start's clean-up (``invoker kill --attempt``) stops only
the records its own start made. On the test bed: the same across 3 sshd nodes.

    pytest tests/runs/test_run_name_rule.py
    flock /tmp/hf-testbed.lock pytest -m sshd tests/runs/test_run_name_rule.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers_project import local_project

SLEEPER = '''\
import time
from higgsfield.experiment import experiment, param


@experiment("sleeper")
@param("sleep", default=3.0)
def sleeper(params):
    time.sleep(params.sleep)
    print(f"rank={params.rank} done", flush=True)
'''

REFUSAL = re.compile(r"error: run '(?P<run>[^']+)' is already (?P<state>queued|starting|running) on (?P<nodes>\S.*): "
                     r"follow it with 'higgsfield logs -f (?P=run)', stop it with 'higgsfield kill (?P=run)', "
                     r"or pick another --run-name\n")


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    return local_project(tmp_path, "nameproj", {"sleeper.py": SLEEPER})


def hf(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HIGGSFIELD_DEBUG"}
    return subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def local_record(project: Path, run: str) -> dict[str, Any]:
    path = project.parent / "state" / "runs" / "nameproj" / run / "run.json"
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def wait_state(read: Any, states: set[str], timeout: float) -> dict[str, Any]:
    """Poll ``read()`` (a record) until its state is one of ``states``."""
    deadline = time.monotonic() + timeout
    rec: dict[str, Any] = {}
    while time.monotonic() < deadline:
        rec = read()
        if rec.get("state") in states:
            return rec
        time.sleep(0.2)
    raise AssertionError(f"state {rec.get('state')!r} after {timeout}s, not one of {sorted(states)}")


def assert_refused(r: subprocess.CompletedProcess[str], run: str, nodes: str) -> None:
    """Exit 2 and one line naming the holder's state and what to do."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    m = REFUSAL.fullmatch(r.stderr)
    assert m, r.stderr
    assert (m.group("run"), m.group("nodes")) == (run, nodes), r.stderr


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_second_start_of_a_running_name_is_refused_and_the_first_run_finishes(project: Path) -> None:
    r = hf(project, "run", "sleeper", "-p", "sleep=6", "--run-name", "dup", "--detach")
    assert r.returncode == 0, r.stderr
    first = local_record(project, "dup")
    wait_state(lambda: local_record(project, "dup"), {"running"}, 60)
    assert_refused(hf(project, "run", "sleeper", "-p", "sleep=0", "--run-name", "dup"), "dup", "localhost")
    assert_refused(hf(project, "run", "sleeper", "--run-name", "dup", "--detach"), "dup", "localhost")
    assert local_record(project, "dup")["state"] == "running"
    done = wait_state(lambda: local_record(project, "dup"), {"succeeded", "failed", "killed"}, 60)
    assert done["state"] == "succeeded" and done["exit_code"] == 0, done
    assert done["attempt"] == first["attempt"] and len(first["attempt"]) == 16
    # a finished run's name is free again: it starts afresh, with an attempt of its own
    again = hf(project, "run", "sleeper", "-p", "sleep=0", "--run-name", "dup")
    assert again.returncode == 0, again.stderr
    assert local_record(project, "dup")["attempt"] not in (None, first["attempt"])


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_starts_of_one_name_at_once_one_wins_and_finishes(project: Path) -> None:
    argv = [sys.executable, "-m", "higgsfield", "run", "sleeper", "-p", "sleep=4", "--run-name", "race"]
    procs = [subprocess.Popen(argv, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], [(c, err[-500:]) for c, _, err in results]
    (loser,) = [subprocess.CompletedProcess(argv, c, out, err) for c, out, err in results if c == 2]
    assert_refused(loser, "race", "localhost")
    (winner,) = [err for c, _, err in results if c == 0]
    assert "race succeeded" in winner
    assert local_record(project, "race")["state"] == "succeeded"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_failed_starts_clean_up_stops_only_its_own_attempt(project: Path) -> None:
    r = hf(project, "run", "sleeper", "-p", "sleep=60", "--run-name", "held", "--detach")
    assert r.returncode == 0, r.stderr
    rec = wait_state(lambda: local_record(project, "held"), {"running"}, 60)
    state = str(project.parent / "state")

    def stop(attempt: str) -> dict[str, Any]:
        out = hf(project, "invoker", "--state-dir", state, "kill", "--project", "nameproj", "--run", "held",
                 "--missing-ok", "--attempt", attempt)
        assert out.returncode == 0, out.stderr
        return dict(json.loads(out.stdout))

    assert stop("0123abcd0123abcd") == {"missing": True, "run": "held", "version": 1}   # another start's clean-up
    time.sleep(1)
    assert local_record(project, "held")["state"] == "running"
    assert stop(rec["attempt"])["state"] == "killed"                        # its own start's clean-up
    assert local_record(project, "held")["state"] == "killed"


# -- the control side's clean-up: which nodes it asks to stop what --------------------------


class _Node:
    """A transport answering ``invoker start`` / ``kill`` from a table: {verb: stdout | exception}."""

    def __init__(self, node: str, answers: dict[str, object]) -> None:
        self.node, self.answers = node, answers
        self.calls: list[list[str]] = []
        self.inputs: list[object] = []

    async def run(self, argv: list[str], input: object = None, timeout: float | None = None) -> object:
        from higgsfield.control.remote.base import CommandResult

        self.calls.append(list(argv))
        self.inputs.append(input)
        answer = self.answers.get(argv[argv.index("invoker") + 3], "{}")
        if isinstance(answer, BaseException):
            raise answer
        return CommandResult(self.node, tuple(argv), 0, str(answer))

    async def close(self) -> None:
        pass


@pytest.mark.timeout(60)
def test_a_refusal_stops_only_this_starts_own_part_and_never_the_holder(project: Path) -> None:
    import asyncio

    from higgsfield.contract.errors import CommandError, RunNameInUse
    from higgsfield.control.backends.nodes.start import launch, plan_run
    from higgsfield.control.config import load_config
    from higgsfield.control.remote.fanout import Group, Member

    yml = project / "higgsfield.yml"
    yml.write_text(yml.read_text().replace(
        "nodes:\n  - host: localhost\n",
        "nodes:\n" + "".join(f"  - host: 10.0.0.{i + 1}\n    name: n{i}\n" for i in range(3))))
    cfg = load_config(yml)
    refusal = json.dumps({"name_in_use": True, "run": "x", "state": "running", "node": "n1"})

    def started(node: str, rank: int, **kw: object) -> str:   # the node's record, as its start answers
        return json.dumps({"project": "p", "experiment": "e", "run": "x", "node": node, "node_rank": rank,
                           "state": "starting", "created_at": 1.0, **kw})

    nodes = [_Node("n0", {"start": started("n0", 0, coord_port=29500),
                          "kill": json.dumps({"state": "killed", "run": "x"})}),
             _Node("n1", {"start": CommandError("n1", "'python' exited 2: error: ...", 2, refusal, "error: ...")}),
             _Node("n2", {"start": started("n2", 2),
                          "kill": json.dumps({"missing": True, "run": "x"})})]
    group = Group([Member(n, t, i) for i, (n, t) in enumerate(zip(cfg.nodes, nodes, strict=True))])  # type: ignore[arg-type]
    with pytest.raises(RunNameInUse) as e:
        asyncio.run(launch(group, cfg, plan_run(cfg, "sleeper", {}, run_name="x")))
    assert e.value.exit_code == 2
    assert str(e.value) == ("run 'x' is already running on n1: follow it with 'higgsfield logs -f x', stop it with "
                            "'higgsfield kill x', or pick another --run-name (this start was stopped on n0)")
    attempt = json.loads(str(nodes[0].inputs[0]))["spec"]["attempt"]
    assert attempt and all(json.loads(str(t.inputs[0]))["spec"]["attempt"] == attempt for t in nodes)
    kills = {t.node: [c for c in t.calls if "kill" in c] for t in nodes}
    assert kills["n1"] == []                      # the node holding the name is not asked to stop anything
    for n in ("n0", "n2"):
        (k,) = kills[n]
        assert k[k.index("--attempt") + 1] == attempt and "--run" in k, k


# -- 3 nodes of the test bed --------------------------------------------------------------------


def _bed_record(i: int, run: str) -> dict[str, Any]:
    try:
        return dict(json.loads(Path(f"/home/hfnode{i}/.hfrt/runs/hfrt/{run}/run.json").read_text()))
    except (OSError, ValueError):
        return {}


@pytest.mark.slow
@pytest.mark.sshd
@pytest.mark.timeout(600)
def test_on_three_nodes_a_second_start_is_refused_and_the_first_finishes_everywhere(deployed) -> None:  # type: ignore[no-untyped-def]
    three = deployed   # the shared 3-node Docker project of tests/runs (deployed once per session)
    run = f"held-{uuid.uuid4().hex[:6]}"
    three.hf("run", "probe", "-p", "sleep=8", "--run-name", run, "--detach", check=True, timeout=300)
    for i in range(3):
        wait_state(lambda i=i: _bed_record(i, run), {"running"}, 120)
    r = three.hf("run", "probe", "-p", "sleep=0", "--run-name", run, timeout=300)
    assert_refused(r, run, "hfnode0")
    assert [_bed_record(i, run)["state"] for i in range(3)] == ["running"] * 3
    done = [wait_state(lambda i=i: _bed_record(i, run), {"succeeded", "failed", "killed"}, 120) for i in range(3)]
    assert [d["state"] for d in done] == ["succeeded"] * 3, done
    assert len({d["attempt"] for d in done}) == 1
    # Once it ended, the name may be re-used (Docker runtime): `run` streams its own attempt only, and
    # `logs` shows both, each under its header, on every node.
    again = three.hf("run", "probe", "-p", "sleep=0", "--run-name", run, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert [again.stdout.count(f"hfnode{i}/{i} | rank={i} secret_len=") for i in range(3)] == [1, 1, 1], again.stdout
    assert "=== attempt" not in again.stdout
    logs = three.hf("logs", run, timeout=120).stdout
    for i in range(3):
        mine = [ln for ln in logs.splitlines() if ln.startswith(f"hfnode{i}/")]
        heads = [n for n, ln in enumerate(mine) if "=== attempt" in ln]
        assert len(heads) == 2 and "attempt 2 (the name re-used) on hfnode0, hfnode1, hfnode2" in mine[heads[1]], mine
        said = [n for n, ln in enumerate(mine) if f"rank={i} secret_len=" in ln]
        assert len(said) == 2 and heads[0] < said[0] < heads[1] < said[1], mine

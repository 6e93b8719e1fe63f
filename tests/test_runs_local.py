"""`higgsfield run | logs | status | kill` on a localhost node: real torchrun, real processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from higgsfield.contract.codec import decode
from higgsfield.contract.errors import NodeLost
from higgsfield.contract.noderuns import NodeRunView
from higgsfield.contract.runstatus import status_json

REPO = Path(__file__).resolve().parents[1]

PROBE = '''
import os, time
from higgsfield.experiment import experiment, param

@experiment("probe")
@param("flag", default=True)
@param("sleep", default=0.0)
def probe(params):
    print(f"rank={params.rank} world={params.world_size} flag={params.flag!r} "
          f"project={os.environ['PROJECT_NAME']} experiment={os.environ['EXPERIMENT_NAME']} "
          f"run={os.environ['RUN_NAME']} secret_len={len(os.environ.get('HF_TEST_SECRET', ''))} "
          f"leak={os.environ.get('HF_LEAK_CANARY', '-')}", flush=True)
    end = time.time() + params.sleep
    while time.time() < end:
        time.sleep(0.05)
'''


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "regression.py").write_text((REPO / "src" / "regression.py").read_text())
    (proj / "src" / "probe.py").write_text(PROBE)
    (proj / "higgsfield.yml").write_text(
        "name: localproj\n"
        "nodes:\n  - host: localhost\n"
        "nproc_per_node: 2\n"
        "runtime: process\n"
        f"state_dir: {tmp_path / 'state'}\n"
        "secrets: [HF_TEST_SECRET]\n")
    env = proj / "env"
    env.write_text("HF_TEST_SECRET=s3cr3t-value-xyz\n")
    env.chmod(0o600)
    return proj


def hf(project: Path, *args: str, timeout: float = 180,
       env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=project, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def run_dirs(project: Path) -> list[Path]:
    root = project.parent / "state" / "runs" / "localproj"
    return sorted(root.iterdir()) if root.is_dir() else []


def test_bad_params_fail_before_anything_starts(project: Path) -> None:
    r = hf(project, "run", "regression", "--param", "steps=abc")
    assert r.returncode == 2
    assert r.stderr.strip() == "error: experiment 'regression': param 'steps': expected an integer, got 'abc'"
    r = hf(project, "run", "regression", "-p", "nope=1")
    assert r.returncode == 2
    assert "unknown param 'nope'" in r.stderr and "Traceback" not in r.stderr
    r = hf(project, "run", "no_such_exp")
    assert r.returncode == 2
    assert "no experiment named 'no_such_exp'" in r.stderr
    assert run_dirs(project) == []


@pytest.mark.slow
def test_run_streams_prefixed_logs_and_records_the_run(project: Path) -> None:
    r = hf(project, "run", "regression", "-p", "steps=30", "--run-name", "r1")
    assert r.returncode == 0, r.stderr
    losses: dict[str, list[float]] = {"0": [], "1": []}
    for line in r.stdout.splitlines():
        m = re.match(r"^localhost/(\d) \| step \d+ loss ([\d.]+)$", line)
        if m:
            losses[m.group(1)].append(float(m.group(2)))
    assert len(losses["0"]) == 30 and len(losses["1"]) == 30
    assert losses["0"][-1] < losses["0"][0] / 10          # the loss falls
    assert "r1 succeeded" in r.stderr
    (rd,) = run_dirs(project)
    record = json.loads((rd / "run.json").read_text())
    assert record["state"] == "succeeded" and record["exit_code"] == 0
    assert "torch.distributed.run" in record["command"] and "--nproc_per_node" in record["command"]
    assert record["pids"]["supervisor"] > 0 and record["pids"]["launcher"] > 0
    assert record["started_at"] <= record["ended_at"]
    assert (rd / "logs" / "rank0.log").read_text().count("loss") == 30
    assert (rd / "logs" / "rank1.log").read_text().count("loss") == 30
    # finished runs keep their logs
    r = hf(project, "logs", "r1", "--rank", "1")
    assert r.returncode == 0 and r.stdout.count("localhost/1 | step") == 30 and "localhost/0 |" not in r.stdout
    # --since: the ranks' lines carry times (rank<N>.idx); a time after the run shows none of them
    assert (rd / "logs" / "rank0.idx").read_text().startswith("0 ")
    r = hf(project, "logs", "r1", "--since", "1h")
    assert r.returncode == 0 and r.stdout.count("localhost/0 | step") == 30
    later = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 5))
    r = hf(project, "logs", "r1", "--since", later)
    assert r.returncode == 0 and r.stdout == "", r.stdout
    # the name re-used: `run` streams this attempt only; `logs` shows both, each under its header
    again = hf(project, "run", "regression", "-p", "steps=5", "--run-name", "r1")
    assert again.returncode == 0 and again.stdout.count("localhost/0 | step") == 5, again.stdout
    assert "=== attempt" not in again.stdout
    both = hf(project, "logs", "r1").stdout.splitlines()
    heads = [i for i, ln in enumerate(both) if "=== attempt" in ln]
    assert len(heads) == 2 and "attempt 1 (first start) on localhost" in both[heads[0]], both[:3]
    assert "attempt 2 (the name re-used) on localhost" in both[heads[1]], both[heads[1]]
    steps = [sum("localhost/0 | step" in ln for ln in part) for part in (both[heads[0]:heads[1]], both[heads[1]:])]
    assert steps == [30, 5], steps


@pytest.mark.slow
def test_params_env_and_secrets_reach_the_run_but_no_file(project: Path) -> None:
    # the invoker's own environment (here: the CLI's, passed on by the local transport) is not the run's
    r = hf(project, "run", "probe", "-p", "flag=FALSE", "--run-name", "p1", env={"HF_LEAK_CANARY": "leaked"})
    assert r.returncode == 0, r.stderr
    assert "rank=0 world=2 flag=False project=localproj experiment=probe run=p1 secret_len=16 leak=-" in r.stdout
    assert "rank=1 world=2 flag=False" in r.stdout and "leaked" not in r.stdout
    (rd,) = run_dirs(project)
    for f in rd.rglob("*"):
        if f.is_file():
            assert "s3cr3t-value-xyz" not in f.read_text(errors="replace"), f
    # the node's state is the node user's alone: directories 0700, files 0600
    state = project.parent / "state"
    loose = [f"{p} {oct(p.stat().st_mode & 0o777)}" for p in [state, *state.rglob("*")]
             if not p.is_symlink() and p.stat().st_mode & 0o077]
    assert loose == [], loose
    assert (state / "queue.json").exists() and (rd / "logs" / "rank1.idx").exists()


@pytest.mark.slow
def test_failure_names_the_rank_and_exit_code(project: Path) -> None:
    r = hf(project, "run", "regression", "-p", "fail_on_rank=1", "-p", "steps=6", "--run-name", "boom")
    assert r.returncode == 1
    assert "failure drill on rank 1" in r.stdout
    assert "boom failed (first failure: node localhost, rank 1)" in r.stderr
    st = json.loads(hf(project, "status", "--json").stdout)
    (run,) = st["runs"]
    assert run["state"] == "failed" and run["failed_rank"] == 1 and run["failed_node"] == "localhost"
    assert run["exit_code"] not in (None, 0)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_detach_status_follow_and_kill_stops_every_process(project: Path) -> None:
    r = hf(project, "run", "probe", "-p", "sleep=120", "--detach", "--run-name", "long")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "long"
    (rd,) = run_dirs(project)
    deadline = time.time() + 90
    while time.time() < deadline:
        pids = [int(p.read_text()) for p in (rd / "logs").glob("rank*.pid")]
        if len(pids) == 2 and "secret_len" in (rd / "logs" / "rank1.log").read_text(errors="replace"):
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the ranks did not start: {(rd / 'run.json').read_text()[:800]}\n"
                    f"{(rd / 'logs' / 'launcher.log').read_text(errors='replace')[-1500:]}")
    st = json.loads(hf(project, "status", "--json").stdout)
    assert [(x["run"], x["state"]) for x in st["runs"]] == [("long", "running")]
    follower = subprocess.Popen([sys.executable, "-m", "higgsfield", "logs", "probe", "-f"], cwd=project,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    record = json.loads((rd / "run.json").read_text())
    workers = pids + [record["pids"]["launcher"], record["pids"]["supervisor"]]
    t0 = time.time()
    k = hf(project, "kill", "long")
    assert k.returncode == 0, k.stderr
    assert k.stdout.strip() == "long: killed"
    while time.time() - t0 < 30 and any(_alive(p) for p in workers):
        time.sleep(0.05)
    gone = time.time()
    assert not [p for p in workers if _alive(p)], "processes outlived the kill"
    # How soon is printed, not asserted: a timed bound fails by chance on a loaded machine (the kill's times are
    # measured in docs/benchmarks.md: 0.9-1.9 s for the journey's 3-node runs); the node's own time, from the kill
    print(f"\nkill: every process gone {gone - (rd / 'kill').stat().st_mtime:.1f} s after the node was asked")
    out, _ = follower.communicate(timeout=30)          # follow mode ends by itself when the run ends
    assert follower.returncode == 0
    assert "localhost/0 | rank=0" in out and "localhost/1 | rank=1" in out
    assert json.loads((rd / "run.json").read_text())["state"] == "killed"
    r = hf(project, "kill", "long")
    assert r.returncode != 0 and "has no queued or running run" in r.stderr


@pytest.mark.slow
def test_run_name_in_use_is_refused(project: Path) -> None:
    r = hf(project, "run", "probe", "-p", "sleep=60", "--detach", "--run-name", "dup")
    assert r.returncode == 0, r.stderr
    try:
        r2 = hf(project, "run", "probe", "--detach", "--run-name", "dup")
        assert r2.returncode == 2
        assert "run 'dup' is already" in r2.stderr and "pick another --run-name" in r2.stderr
    finally:
        hf(project, "kill", "dup")


def test_entrypoint_runs_without_torchrun_env(project: Path, tmp_path: Path) -> None:
    """The entrypoint alone (no torchrun) runs an experiment as rank 0 of 1."""
    rd = tmp_path / "rd"
    (rd / "logs").mkdir(parents=True)
    (rd / "spec.json").write_text(json.dumps({
        "project": "localproj", "experiment": "probe", "run": "solo", "module": "probe",
        "code_dir": str(project), "params": {"flag": "yes"}, "version": 1,   # a RunSpec (higgsfield.contract.runspec)
        "node": "localhost", "node_rank": 0, "nodes": ["localhost"], "master_addr": "127.0.0.1", "submitted_at": 0}))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PROJECT_NAME="localproj", EXPERIMENT_NAME="probe", RUN_NAME="solo")
    r = subprocess.run([sys.executable, "-m", "higgsfield.node.entrypoint", str(rd)], env=env, timeout=60)
    assert r.returncode == 0
    assert "rank=0 world=1 flag=True project=localproj" in (rd / "logs" / "rank0.log").read_text()


# -- control side, without nodes ---------------------------------------------------------------

def test_node_log_lines_cannot_drive_the_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    from higgsfield.control.backends.nodes import LogLine
    from higgsfield.control.cli._lines import print_lines

    hostile = "ok\x1b[2J\x1b]0;owned\x07 done\tcol\r\x9b31m\x00end"
    print_lines([LogLine("n1", 0, hostile)], color=False)
    out = capsys.readouterr().out
    assert out == "n1/0 | ok\u241b[2J\u241b]0;owned\u2407 done\tcol\u240d\\x9b31m\u2400end\n"   # shown inert, not dropped


class _FakeTransport:
    """Answers invoker commands from a table: {subcommand: stdout | exception}."""

    def __init__(self, node: str, answers: dict[str, object]) -> None:
        self.node = node
        self.answers = answers
        self.calls: list[list[str]] = []
        self.inputs: list[object] = []
        self.streams: list[list[object]] = []
        self.closes = 0

    async def run(self, argv: list[str], input: object = None, timeout: float | None = None) -> object:
        from higgsfield.control.remote.base import CommandResult

        sub = argv[argv.index("invoker") + 3]
        self.calls.append(argv)
        self.inputs.append(input)
        answer = self.answers.get(sub, "{}")
        if isinstance(answer, BaseException):
            raise answer
        return CommandResult(self.node, tuple(argv), 0, str(answer))

    async def stream(self, argv: list[str], input: object = None):  # type: ignore[no-untyped-def]
        """Answers from ``streams``: one list per call, each item a line or an exception to raise."""
        self.calls.append(argv)
        for item in self.streams.pop(0) if self.streams else []:
            if isinstance(item, BaseException):
                raise item
            yield item

    async def close(self) -> None:
        self.closes += 1


def _fake_group(monkeypatch: pytest.MonkeyPatch, transports: list[_FakeTransport]) -> list[object]:
    """Every group a command opens is made of ``transports``; returns the list of groups opened."""
    import contextlib

    from higgsfield.control.backends import nodes as orchestrator
    from higgsfield.control.backends.nodes import backend as nodes_backend
    from higgsfield.control.remote.fanout import Group, Member

    opened: list[object] = []

    @contextlib.asynccontextmanager
    async def open_group(cfg, nodes=None):  # type: ignore[no-untyped-def]
        chosen = list(nodes if nodes is not None else cfg.nodes)
        by_name = {t.node: t for t in transports}
        group = Group([Member(n, by_name[str(n.name)], i) for i, n in enumerate(chosen)])  # type: ignore[arg-type]
        opened.append(group)
        yield group

    monkeypatch.setattr(orchestrator, "connect", open_group)
    monkeypatch.setattr(nodes_backend, "connect", open_group)   # what the CLI's backend opens
    return opened


def _group(cfg, transports: list[_FakeTransport]):  # type: ignore[no-untyped-def]
    from higgsfield.control.remote.fanout import Group, Member

    by_name = {t.node: t for t in transports}
    return Group([Member(n, by_name[str(n.name)], i) for i, n in enumerate(cfg.nodes)])  # type: ignore[arg-type]


def _collect(lines) -> list:  # type: ignore[no-untyped-def, type-arg]
    """Every item of the async iterator ``lines``, with its own event loop."""
    import asyncio

    async def go() -> list:  # type: ignore[type-arg]
        return [line async for line in lines]

    return asyncio.run(go())


def _start(cfg, experiment: str, run_name: str):  # type: ignore[no-untyped-def]
    """Start as ``higgsfield run`` does: the backend's plan, one session, its start (with its own event loop)."""
    import asyncio

    from higgsfield.control.backends import RunRequest
    from higgsfield.control.backends.nodes.backend import NodesBackend

    backend = NodesBackend(cfg)
    plan = backend.plan(RunRequest(experiment, {}, run_name=run_name))

    async def go():  # type: ignore[no-untyped-def]
        async with backend.session(plan) as session:
            return await session.start(plan)

    return asyncio.run(go())


def _two_node_cfg(project: Path):  # type: ignore[no-untyped-def]
    from higgsfield.control.config import load_config

    yml = project / "higgsfield.yml"
    yml.write_text(yml.read_text().replace("nodes:\n  - host: localhost\n",
                                           "nodes:\n  - host: 10.0.0.1\n    name: a\n  - host: 10.0.0.2\n    name: b\n"))
    return load_config(yml)


def test_a_failed_start_kills_on_every_node_and_names_where_the_kill_failed(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from higgsfield.contract.errors import CommandError, RunError

    cfg = _two_node_cfg(project)
    started = json.dumps({"project": "localproj", "experiment": "probe", "run": "x", "node": "a", "node_rank": 0,
                          "state": "starting", "created_at": 1.0, "coord_port": 29500})
    a = _FakeTransport("a", {"start": started, "kill": json.dumps({"state": "killed", "run": "x"})})
    b = _FakeTransport("b", {"start": asyncio.TimeoutError(), "kill": CommandError("b", "connection lost")})
    _fake_group(monkeypatch, [a, b])
    with pytest.raises(RunError) as e:
        _start(cfg, "probe", run_name="x")
    msg = str(e.value)
    assert "failed to start on 1 node(s): b: timed out" in msg
    assert "stopped it on a" in msg and "could not stop it on b: connection lost" in msg
    # the node that timed out was asked to kill too (it may have a supervisor running)
    for t in (a, b):
        kills = [c for c in t.calls if "kill" in c]
        assert kills and "--missing-ok" in kills[0], t.node
    # node 0 started first and b was told where node 0's coordinator listens; the token never in argv
    starts = [c for t in (a, b) for c in t.calls if "start" in c]
    assert [c for c in a.calls if "start" in c] == starts[:1]
    assert all("token" not in " ".join(c) for c in starts)
    sent = json.loads(next(i for c, i in zip(b.calls, b.inputs, strict=True) if "start" in c))  # after the drift check
    assert sent["spec"]["coordinator"] == {"host": "10.0.0.1", "port": 29500, "node": "a"}
    assert len(sent["token"]) == 64 and "token" not in sent["spec"]


@pytest.mark.parametrize("stdout,needle", [("Traceback (most recent call last):\n ...", "Traceback"),
                                           ('{"no_state": 1}', "'project' is missing"), ("", "nothing")])
def test_unexpected_invoker_output_is_one_clear_error(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                      stdout: str, needle: str) -> None:
    from higgsfield.contract.errors import RunError

    cfg = _two_node_cfg(project)
    _fake_group(monkeypatch, [_FakeTransport("a", {"start": stdout}), _FakeTransport("b", {})])
    with pytest.raises(RunError) as e:
        _start(cfg, "probe", run_name="x")
    assert "unexpected invoker output" in str(e.value) and needle in str(e.value)
    assert "higgsfield setup" in str(e.value) and "failed to start on 1 node(s): a:" in str(e.value)


def test_a_printer_stopping_early_closes_every_node_stream(project: Path) -> None:
    """A closed pipe (or Ctrl-C) while following: the streams' tasks end and each node's stream is closed."""
    import asyncio
    import io

    from higgsfield.control.backends.nodes import follow, merge
    from higgsfield.control.cli._lines import print_stream

    cfg = _two_node_cfg(project)
    closed: list[str] = []

    class Endless(_FakeTransport):
        async def stream(self, argv: list[str], input: object = None):  # type: ignore[no-untyped-def]
            try:
                i = 0
                while True:
                    i += 1
                    yield f"0\tline {i}"
                    await asyncio.sleep(0.001)
            finally:
                closed.append(self.node)   # where an SSH stream stops its remote command

    class Pipe(io.StringIO):
        def write(self, text: str) -> int:
            if self.getvalue().count("\n") >= 5:
                raise BrokenPipeError
            return super().write(text)

    status = merge([decode(NodeRunView, {"project": "localproj", "experiment": "probe", "run": "x", "node": n,
                                         "node_rank": i, "state": "running", "created_at": 1.0})
                    for i, n in enumerate(("a", "b"))])[0]
    group = _group(cfg, [Endless("a", {}), Endless("b", {})])

    async def go() -> int:
        with pytest.raises(BrokenPipeError):
            await print_stream(follow(group, cfg, status, lost_after=30), color=False)
        return len([t for t in asyncio.all_tasks() if t is not asyncio.current_task()])

    out = Pipe()
    saved, sys.stdout = sys.stdout, out
    try:
        left = asyncio.run(go())
    finally:
        sys.stdout = saved
    assert out.getvalue().count("\n") == 5
    assert sorted(closed) == ["a", "b"], "a node's stream was left open"
    assert left == 0, "a stream's task outlived the printer"


def test_run_starts_follows_and_ends_over_one_group(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``higgsfield run``: start, follow and the final status in one event loop, over one group's connections."""
    import asyncio

    from higgsfield.control import backends
    from higgsfield.control.cli._common import console
    from higgsfield.control.cli.runs import _run

    cfg = _two_node_cfg(project)
    rec = {"project": "localproj", "experiment": "probe", "run": "x", "created_at": 1.0, "nnodes": 2}
    done = [{**rec, "node": n, "node_rank": i, "state": "succeeded", "exit_code": 0} for i, n in enumerate("ab")]
    a = _FakeTransport("a", {"start": json.dumps({**rec, "node": "a", "node_rank": 0, "state": "starting",
                                                  "coord_port": 29500}),
                             "status": json.dumps(done[:1])})
    b = _FakeTransport("b", {"start": json.dumps({**rec, "node": "b", "node_rank": 1, "state": "starting"}),
                             "status": json.dumps(done[1:])})
    a.streams = [["0\tstep 1", "0\tdone"]]
    b.streams = [["1\tstep 1", "1\tdone"]]
    opened = _fake_group(monkeypatch, [a, b])
    backend = backends.backend_for(cfg)
    plan = backend.plan(backends.RunRequest("probe", {}, run_name="x"))
    started: list[object] = []
    final = asyncio.run(_run(backend, plan, {}, detach=False, err=console(stderr=True), started=started))  # type: ignore[arg-type]
    assert final is not None and final.state == "succeeded" and final.run == "x"
    assert len(opened) == 1, "run opened more than one group"
    for t in (a, b):   # the drift check's facts, start, the log stream, one status question: one transport
        subs = [c[c.index("invoker") + 3] for c in t.calls]
        assert subs == ["facts", "start", "logs", "status"], (t.node, subs)


def test_status_names_the_earliest_failure_and_run_exits_with_the_failing_node_s_code() -> None:
    from higgsfield.control.backends.nodes import merge as _merge
    from higgsfield.control.cli.runs import exit_code

    base = {"project": "p", "experiment": "e", "run": "r", "nnodes": 3, "nproc": 1, "created_at": 1.0}

    def rec(node: str, rank: int, state: str, **kw: object) -> NodeRunView:
        return decode(NodeRunView, {**base, "node": node, "node_rank": rank, "state": state, **kw})

    # b was cut off from the coordinator and kept its own (later, secondary) failure; a and c have the verdict
    verdict = {"failed_node": "c", "failed_rank": 2, "failed_at": 10.0, "reason": "rank 2 was killed by SIGKILL",
               "error_tail": ["step 3", "Killed"]}
    (st,) = _merge([rec("a", 0, "failed", exit_code=143, **verdict),
                    rec("b", 1, "failed", exit_code=1, failed_node="b", failed_rank=1, failed_at=10.4,
                        reason="rank 1: connection reset", error_tail=[]),
                    rec("c", 2, "failed", exit_code=-9, **verdict)])
    assert (st.failed_node, st.failed_rank, st.reason, st.error_tail) == ("c", 2, "rank 2 was killed by SIGKILL",
                                                                          ["step 3", "Killed"])
    assert st.exit_code == -9 and exit_code(st) == 137
    assert status_json(st)["error_tail"] == ["step 3", "Killed"]
    (ok,) = _merge([rec("a", 0, "succeeded", exit_code=0), rec("b", 1, "succeeded", exit_code=0)])
    assert exit_code(ok) == 0 and ok.failed_node is None
    (killed,) = _merge([rec("a", 0, "killed", exit_code=143), rec("b", 1, "killed")])
    assert exit_code(killed) == 1 and killed.error_tail == []


def test_a_broken_log_stream_is_reattached_without_losing_or_repeating_a_line(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from higgsfield.contract.errors import CommandError
    from higgsfield.control.backends.nodes import NOTICE, follow, logs, merge

    cfg = _two_node_cfg(project)
    a, b = _FakeTransport("a", {}), _FakeTransport("b", {})
    a.streams = [["0\tstep 1", "-1\tlaunch", "0\tstep 2", CommandError("a", "connection lost")],
                 ["#hb", "0\tstep 1", "-1\tlaunch", "0\tstep 2", "0\tstep 3", "-1\tdone"]]
    b.streams = [["1\tstep 1", "1\tstep 2", "1\tstep 3"]]
    group = _group(cfg, [a, b])
    status = merge([decode(NodeRunView, {"project": "localproj", "experiment": "probe", "run": "x", "node": n,
                                         "node_rank": i, "state": "running", "created_at": 1.0})
                    for i, n in enumerate(("a", "b"))])[0]
    lines = _collect(follow(group, cfg, status, lost_after=30))
    by_node = {n: [(ln.rank, ln.text) for ln in lines if ln.node == n and ln.rank != NOTICE] for n in "ab"}
    assert by_node["a"] == [(0, "step 1"), (-1, "launch"), (0, "step 2"), (0, "step 3"), (-1, "done")]
    assert by_node["b"] == [(1, "step 1"), (1, "step 2"), (1, "step 3")]
    notices = [ln.text for ln in lines if ln.rank == NOTICE]
    assert notices == ["lost the log stream (connection lost); re-attaching"]
    assert not [c for t in (a, b) for c in t.calls if "kill" in c]      # the nodes decide the run, not this side
    assert a.closes == 0   # re-attached over the same transport and its connection

    # a node whose stream never comes back, once the others ended: reported, and still nothing is killed;
    # its connection is closed, so the final status logs in afresh
    monkeypatch.setattr(logs, "REATTACH_TRIES", 1)
    a.streams = [["0\tstep 1", CommandError("a", "connection lost")], [CommandError("a", "refused")]]
    b.streams = [["1\tstep 1"]]
    a.calls.clear()
    with pytest.raises(NodeLost, match="lost the log stream of node a .*refused; whether the run goes on"):
        _collect(follow(group, cfg, status, lost_after=30))
    assert not [c for c in a.calls if "kill" in c]
    assert a.closes == 1 and b.closes == 0


def test_status_of_a_recovered_run_leaves_the_lost_node_out_and_shows_the_recovery() -> None:
    from higgsfield.control.backends.nodes import merge as _merge

    base = {"project": "p", "experiment": "e", "run": "r", "nproc": 1, "created_at": 1.0}
    first = {"number": 1, "at": 1.0, "nodes": ["a", "b", "c"], "why": "first start"}
    again = {"number": 2, "at": 9.0, "nodes": ["a", "b"], "why": "recovery 1: c lost", "lost": ["c"]}
    survivor = {**base, "nnodes": 2, "state": "succeeded", "exit_code": 0, "lost": ["c"], "attempts": [first, again]}
    # c's record stays as the power cut left it (running), and its supervisor died with it
    (st,) = _merge([decode(NodeRunView, {**survivor, "node": "a", "node_rank": 0}),
                    decode(NodeRunView, {**survivor, "node": "b", "node_rank": 1}),
                    decode(NodeRunView, {**base, "nnodes": 3, "node": "c", "node_rank": 2, "state": "running",
                                         "attempts": [first]})])
    assert st.state == "succeeded" and st.lost == ["c"] and st.nodes["c"].state == "lost"
    js = status_json(st)
    assert [a["number"] for a in js["attempts"]] == [1, 2]
    assert js["recoveries"] == [{"number": 2, "at": 9.0, "nodes": ["a", "b"], "why": "recovery 1: c lost",
                                 "lost": ["c"]}]
    assert js["lost"] == ["c"] and js["node_states"]["c"] == "lost"

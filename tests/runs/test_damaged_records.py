"""One damaged file in a node's state directory hides only its own run (issue 22, item 2).

Each damaged shape sits next to healthy runs in a localhost node's real state
directory: truncated JSON, a JSON list, a field of the wrong type, binary bytes, a
symlink to a record outside the state dir, a symlinked run directory, directories
named with ESC bytes or a leading ``..``, a record whose run is ``../x``, a 2 MiB
file, a 200,000-line error tail, a long and a string error tail. Driven as a user
drives it: the node's ``higgsfield invoker status`` and ``higgsfield status``,
``status --json``, ``logs`` and ``kill`` of a project whose node is ``localhost``.
The healthy runs still show (with their params), each damaged file is named with
its reason on one line, nothing outside the state dir is read, no escape byte
reaches the terminal, and a running run beside the damage can be killed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.decode import TAIL_LINES, DecodeError
from higgsfield.contract.noderuns import NodeRunView, read_node_runs
from higgsfield.node.state.records import RunRecord

pytestmark = pytest.mark.timeout(180)

PROJECT = "dmgproj"
OUTSIDE_MARK = "OUTSIDE-THE-STATE-DIR-0042"
ESC_NAME = "evil\x1b]0;pwned\x07\x1b[31m"

PROBE = '''
import time
from higgsfield.experiment import experiment, param

@experiment("probe")
@param("sleep", default=0.0)
def probe(params):
    print(f"rank={params.rank} up", flush=True)
    end = time.time() + params.sleep
    while time.time() < end:
        time.sleep(0.05)
'''


def record(run: str, **kw: object) -> dict[str, object]:
    now = time.time()
    rec: dict[str, object] = {
        "project": PROJECT, "experiment": "probe", "run": run, "node": "localhost", "node_rank": 0, "nnodes": 1,
        "nproc": 1, "state": "succeeded", "runtime": "process", "created_at": now - 100, "started_at": now - 90,
        "ended_at": now - 10, "exit_code": 0}
    rec.update(kw)
    return rec


def spec(run: str, state: Path, params: dict[str, object]) -> dict[str, object]:
    from higgsfield.contract.runspec import RunSpec

    s = RunSpec(project=PROJECT, experiment="probe", run=run, module="probe", code_dir=str(state / "code"),
                params=params, node="localhost", node_rank=0, nodes=("localhost",), master_addr="127.0.0.1",
                submitted_at=time.time(), nproc=1, runtime="process")
    return {**encode(s), "gpus": 0, "cache_dir": str(state / "cache"), "checkpoint_dir": str(state / "ck"),
            "container": f"hf-{run}", "python": sys.executable}


def write(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def fail(run: str, tail: object) -> dict[str, object]:
    return record(run, state="failed", exit_code=1, failed_node="localhost", failed_rank=0, reason="rank 0 exited 1",
                  failed_at=time.time(), error_tail=tail)


#: run directory -> (what is wrong, the reason its skip line must give)
DAMAGED = {
    "trunc": ("truncated JSON", "not JSON (line"),
    "alist": ("a JSON list", "is a list, not an object"),
    "wrongtype": ("a field of the wrong type", "'node_rank' must be an integer, not a string"),
    "binary": ("binary bytes", "not UTF-8"),
    "linked": ("run.json a symlink out of the state dir", "run.json is a symlink (not followed)"),
    "linkdir": ("a symlinked run directory", "a symlink (not followed)"),
    ESC_NAME: ("a directory named with ESC bytes", "not a run name"),
    "..evil": ("a directory named with a leading ..", "not a run name"),
    "dotdot": ("a record whose run is ../x", "'run' '../x' is not a run name"),
    "huge": ("a 2 MiB file", "too big"),
    "longtail": ("a 200,000-line error tail", "too big"),
    "badspec": ("a healthy record with a spec.json that is not JSON", "spec.json: not JSON"),
}
HEALTHY = ["ok-1", "tail-many", "tail-str", "badspec"]


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "probe.py").write_text(PROBE)
    state = tmp_path / "state"
    (proj / "higgsfield.yml").write_text(f"name: {PROJECT}\nnodes:\n  - host: localhost\nnproc_per_node: 1\n"
                                         f"runtime: process\nstate_dir: {state}\n")
    runs = state / "runs" / PROJECT
    outside = tmp_path / "outside"
    outside.mkdir()

    write(runs / "ok-1" / "run.json", record("ok-1"))
    write(runs / "ok-1" / "spec.json", spec("ok-1", state, {"lr": 0.5, "model": "tiny"}))
    (runs / "ok-1" / "logs").mkdir()
    (runs / "ok-1" / "logs" / "rank0.log").write_text("rank=0 says hello\nrank=0 done\n")
    write(runs / "tail-many" / "run.json", fail("tail-many", [f"f{k}" for k in range(60_000)]))   # under 1 MiB
    write(runs / "tail-str" / "run.json", fail("tail-str", "Traceback: one string, not a list of lines"))
    write(runs / "badspec" / "run.json", record("badspec"))
    (runs / "badspec" / "spec.json").write_text('{"project": ')

    text = json.dumps(record("trunc"))
    (runs / "trunc").mkdir()
    (runs / "trunc" / "run.json").write_text(text[: len(text) // 2])
    write(runs / "alist" / "run.json", [1, 2, 3])
    write(runs / "wrongtype" / "run.json", record("wrongtype", node_rank="zero"))
    (runs / "binary").mkdir()
    (runs / "binary" / "run.json").write_bytes(bytes(range(256)) * 4)
    write(outside / "foreign.json", record("linked", reason=OUTSIDE_MARK))
    (runs / "linked").mkdir()
    (runs / "linked" / "run.json").symlink_to(outside / "foreign.json")
    write(outside / "run" / "run.json", record("linkdir", reason=OUTSIDE_MARK))
    (runs / "linkdir").symlink_to(outside / "run", target_is_directory=True)
    write(runs / ESC_NAME / "run.json", record("evil"))
    write(runs / "..evil" / "run.json", record("evil"))
    write(runs / "dotdot" / "run.json", record("../x"))
    write(runs / "huge" / "run.json", record("huge", reason="x" * (2 << 20)))
    write(runs / "longtail" / "run.json", fail("longtail", [f"frame {k}" for k in range(200_000)]))
    return proj


def hf(project: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIGGSFIELD_")}
    env.update(COLUMNS="200", TERM="dumb")
    return subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=project, capture_output=True,
                          text=True, timeout=timeout, env=env)


def state_of(project: Path) -> Path:
    return project.parent / "state"


def skip_reason(lines: list[str], run: str) -> str:
    """The one skip line that names run directory ``run`` (escaped as the node writes it)."""
    shown = json.dumps(run)[1:-1].replace("\\u001b", "\\x1b").replace("\\u0007", "\\x07")
    mine = [ln for ln in lines if f"runs/{PROJECT}/{shown}" in ln]
    assert len(mine) == 1, (run, lines)
    return mine[0]


def test_invoker_status_skips_each_damaged_file_with_one_line_and_shows_the_rest(project: Path) -> None:
    r = hf(project, "invoker", "--state-dir", str(state_of(project)), "status", "--project", PROJECT)
    assert r.returncode == 0, r.stderr
    assert OUTSIDE_MARK not in r.stdout and "\x1b" not in r.stdout
    reply = json.loads(r.stdout)
    assert reply["version"] == 1
    runs = {x["run"]: x for x in reply["runs"]}
    assert sorted(runs) == sorted(HEALTHY)
    assert runs["ok-1"]["params"] == {"lr": 0.5, "model": "tiny"}
    assert runs["tail-str"]["error_tail"] == ["Traceback: one string, not a list of lines"]
    assert runs["tail-many"]["error_tail"] == [f"f{k}" for k in range(60_000 - TAIL_LINES, 60_000)]
    for run, (_what, reason) in DAMAGED.items():
        line = skip_reason(reply["skipped"], run)
        assert reason in line, (run, line)
    assert len(reply["skipped"]) == len(DAMAGED)
    assert "runs/dmgproj/trunc/run.json: not JSON (line 1: " in " ".join(reply["skipped"])


def test_status_and_status_json_show_every_healthy_run_with_params_and_warn_once_per_file(project: Path) -> None:
    r = hf(project, "status", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["unreachable"] == {}
    runs = {x["run"]: x for x in data["runs"]}
    assert sorted(runs) == sorted(HEALTHY)
    assert runs["ok-1"]["params"] == {"lr": 0.5, "model": "tiny"}     # the params fix: from the node's spec
    assert runs["ok-1"]["node_states"] == {"localhost": "succeeded"}
    assert runs["tail-str"]["error_tail"] == ["Traceback: one string, not a list of lines"]
    assert len(runs["tail-many"]["error_tail"]) == TAIL_LINES
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: localhost: skipped ")]
    assert len(warnings) == len(DAMAGED), r.stderr
    assert any(ln.startswith(f"warning: localhost: skipped runs/{PROJECT}/trunc/run.json: not JSON (line 1: ")
               for ln in warnings), warnings
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr and OUTSIDE_MARK not in r.stdout + r.stderr

    t = hf(project, "status")
    assert t.returncode == 0, t.stderr
    assert "unreachable" not in t.stdout + t.stderr
    table = t.stdout.split("\n\n")[0]
    assert sorted(ln.split()[0] for ln in table.splitlines()[1:]) == sorted(HEALTHY)
    assert "\x1b" not in t.stdout + t.stderr and OUTSIDE_MARK not in t.stdout + t.stderr
    assert len(t.stdout.splitlines()) < 200          # a 60,000-line tail prints at most TAIL_LINES lines
    assert len([ln for ln in t.stderr.splitlines() if "skipped" in ln]) == len(DAMAGED)


def test_logs_of_a_healthy_run_beside_the_damage(project: Path) -> None:
    r = hf(project, "logs", "ok-1")
    assert r.returncode == 0, r.stderr
    assert "rank=0 says hello" in r.stdout and "rank=0 done" in r.stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_running_run_beside_damaged_records_shows_and_is_killed(project: Path) -> None:
    r = hf(project, "run", "probe", "-p", "sleep=120", "--detach", "--run-name", "live", timeout=180)
    assert r.returncode == 0, r.stderr
    rd = state_of(project) / "runs" / PROJECT / "live"
    deadline = time.time() + 90
    while time.time() < deadline:
        log = rd / "logs" / "rank0.log"
        if log.exists() and "up" in log.read_text(errors="replace"):
            break
        time.sleep(0.2)
    else:
        pytest.fail("the run did not start")
    st = json.loads(hf(project, "status", "--json").stdout)
    assert {x["run"]: x["state"] for x in st["runs"]}["live"] == "running"
    k = hf(project, "kill", "live")
    assert k.returncode == 0, k.stderr
    assert k.stdout.strip() == "live: killed"
    assert json.loads((rd / "run.json").read_text())["state"] == "killed"
    after = {x["run"]: x["state"] for x in json.loads(hf(project, "status", "--json").stdout)["runs"]}
    assert after["live"] == "killed" and after["ok-1"] == "succeeded"


def test_a_record_is_decoded_field_by_field() -> None:
    good = record("r1", error_tail=["a", "b"])
    assert decode(RunRecord, good).error_tail == ["a", "b"]
    for key, bad, words in [("node_rank", "0", "'node_rank' must be an integer, not a string"),
                            ("pids", [1], "'pids' must be an object of integers, not a list"),
                            ("created_at", True, "'created_at' must be a number, not a boolean"),
                            ("state", "exploded", "'state' 'exploded' is not a run state"),
                            ("project", "../p", "'project' '../p' is not a project name"),
                            ("node", "a b", "node name 'a b' is not valid"),
                            ("error_tail", [{"x": 1}], "'error_tail' must be a list of strings")]:
        with pytest.raises(DecodeError) as e:
            decode(RunRecord, {**good, key: bad})
        assert words in str(e.value), (key, str(e.value))
    with pytest.raises(DecodeError, match="'node' is missing"):
        decode(RunRecord, {k: v for k, v in good.items() if k != "node"})
    assert decode(RunRecord, {**good, "error_tail": "one line"}).error_tail == ["one line"]
    assert decode(RunRecord, {**good, "error_tail": ["y" * 10_000]}).error_tail[0].startswith("y" * 500 + "…")


def test_the_control_side_decodes_a_reply_once_and_an_older_node_s_bare_list() -> None:
    reply = read_node_runs({"version": 1, "runs": [record("a"), record("b", node_rank=[0])],
                            "skipped": ["runs/p/x/run.json: not JSON (line 1: Expecting value)"]})
    assert [v.run for v in reply.runs] == ["a"]
    assert reply.skipped[0] == "runs/p/x/run.json: not JSON (line 1: Expecting value)"
    assert "'node_rank' must be an integer, not a list" in reply.skipped[1]
    old = read_node_runs([record("a", pids={"supervisor": 1})])
    assert encode(old.runs[0])["pids"] == {"supervisor": 1}     # keys the view does not type travel along
    with pytest.raises(DecodeError, match="version 9"):
        read_node_runs({"version": 9, "runs": []})
    assert decode(NodeRunView, record("a", error_tail="x")).error_tail == ["x"]


def test_status_json_shows_the_params_of_each_run_from_its_spec(tmp_path: Path) -> None:
    """``status --json`` once showed ``"params": {}`` for every run: ``invoker status`` sent none."""
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    state = tmp_path / "state"
    (proj / "higgsfield.yml").write_text(f"name: {PROJECT}\nnodes:\n  - host: localhost\nruntime: process\n"
                                         f"state_dir: {state}\n")
    cases: list[tuple[str, dict[str, object]]] = [("p-1", {"lr": 0.1}), ("p-2", {"lr": 0.2, "layers": [1, 2]})]
    for run, params in cases:
        write(state / "runs" / PROJECT / run / "run.json", record(run))
        write(state / "runs" / PROJECT / run / "spec.json", spec(run, state, params))
    r = hf(proj, "status", "--json")
    assert r.returncode == 0, r.stderr
    assert {x["run"]: x["params"] for x in json.loads(r.stdout)["runs"]} == {
        "p-1": {"lr": 0.1}, "p-2": {"lr": 0.2, "layers": [1, 2]}}
    assert r.stderr == ""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_damaged_record_on_an_ssh_node_leaves_it_reachable_and_params_show(cluster: Any) -> None:
    """On the test bed: hfnode1 holds a healthy run and two damaged records; ``status --json`` over SSH."""
    import pwd
    import shutil

    from runs_helpers import STATE

    project, node = cluster.dir.name, "hfnode1"
    run = f"dmg-{os.getpid()}"
    pw = pwd.getpwnam(node)
    runs = Path(pw.pw_dir) / STATE / "runs" / project
    made = [runs / run, runs / f"{run}-trunc", runs / f"{run}-list"]
    rec = record(run, node=node)
    rec["project"] = project
    sp = spec(run, Path(pw.pw_dir) / STATE, {"lr": 0.25, "model": "bed"})
    sp.update(project=project, node=node, nodes=[node])
    try:
        write(runs / run / "run.json", rec)
        write(runs / run / "spec.json", sp)
        (runs / f"{run}-trunc").mkdir(parents=True)
        (runs / f"{run}-trunc" / "run.json").write_text(json.dumps(rec)[:40])
        write(runs / f"{run}-list" / "run.json", [rec])
        for p in [runs.parent, runs, *made, *(f for d in made for f in d.iterdir())]:
            os.chown(p, pw.pw_uid, pw.pw_gid)
            p.chmod(0o700 if p.is_dir() else 0o600)
        r = cluster.hf("status", "--json", timeout=120)
        assert r.returncode == 0, r.stderr
        data = json.loads(r.stdout)
        assert data["unreachable"] == {}
        mine = {x["run"]: x for x in data["runs"] if x["run"].startswith(run)}
        assert list(mine) == [run]
        assert mine[run]["params"] == {"lr": 0.25, "model": "bed"}
        assert mine[run]["node_states"] == {node: "succeeded"}
        assert f"warning: {node}: skipped runs/{project}/{run}-trunc/run.json: not JSON (line 1: " in r.stderr
        assert f"warning: {node}: skipped runs/{project}/{run}-list/run.json: the record is a list" in r.stderr
    finally:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)


def test_the_dashboard_feed_shows_the_healthy_runs_and_names_the_damaged_files(project: Path) -> None:
    from higgsfield.node.observe.watch import feed
    from higgsfield.node.state.home import NodeState

    msgs: list[dict[str, Any]] = []
    feed(NodeState(state_of(project)), every=0.1, project=PROJECT, emit=msgs.append, ticks=2)
    runs = [m for m in msgs if "runs" in m]
    assert runs and runs[0]["full"] is True
    shown = {r["run"]: r for r in runs[0]["runs"]}
    assert sorted(shown) == sorted(HEALTHY) and shown["ok-1"]["params"] == {"lr": 0.5, "model": "tiny"}
    skipped = next(m["skipped"] for m in msgs if "skipped" in m)
    assert len(skipped) == len(DAMAGED) - 1            # the feed names damaged records, not a damaged spec
    assert "\x1b" not in json.dumps(msgs) and OUTSIDE_MARK not in json.dumps(msgs)


def test_killing_a_damaged_run_by_name_is_one_line_and_leaves_the_rest(project: Path) -> None:
    state = str(state_of(project))
    r = hf(project, "invoker", "--state-dir", state, "kill", "--project", PROJECT, "--target", "trunc")
    assert r.returncode == 1
    assert r.stderr.strip().startswith(f"error: runs/{PROJECT}/trunc/run.json: not JSON (line 1: "), r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    r = hf(project, "invoker", "--state-dir", state, "kill", "--project", PROJECT, "--target", "probe")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"matched": len(HEALTHY), "killed": [], "version": 1}   # every run of it ended already

"""The hub's re-run form and its validation (the Actions form's fields, checked as ``higgsfield run`` checks
them), the run view the page gets (RunStatus plus queue places, no record internals, no secret), and the
``higgsfield ui`` command's one-line errors. No node is contacted."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers_project import cli_env

pytest.importorskip("starlette")

from starlette.testclient import TestClient  # noqa: E402

from higgsfield.contract import states  # noqa: E402
from higgsfield.contract.errors import HiggsfieldError, ParamError  # noqa: E402
from higgsfield.contract.feed import FeedLine  # noqa: E402
from higgsfield.control.config import load_config  # noqa: E402
from higgsfield.control.ui.app import STATIC, create_app  # noqa: E402
from higgsfield.control.ui.hub import Hub  # noqa: E402

pytestmark = pytest.mark.timeout(60)
SECRET = "s3cr3t-never-in-the-browser"
EXPERIMENT = '''
from higgsfield.experiment import experiment, param

@experiment("train")
@param("size", default="7b", options=["7b", "13b"])
@param("lr", default=0.1)
@param("steps", default=10)
@param("packing", default=False)
@param("name", required=True, type=str)
def train(params):
    pass
'''


@pytest.fixture()
def hub(tmp_path: Path) -> Hub:
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "train.py").write_text(EXPERIMENT)
    (proj / "higgsfield.yml").write_text("name: hubproj\nnodes:\n  - host: localhost\n  - host: gpu-2.example.com\n"
                                         "ssh:\n  user: ubuntu\n"
                                         f"state_dir: {tmp_path / 'state'}\nsecrets: [HF_TOKEN]\n")
    (proj / "env").write_text(f"HF_TOKEN={SECRET}\n")
    (proj / "env").chmod(0o600)
    return Hub(load_config(proj / "higgsfield.yml"))


def test_the_form_is_the_actions_form_filled_from_the_run(hub: Hub) -> None:
    form = hub.form("train")
    fields = {f["name"]: f for f in form["fields"]}
    assert list(fields) == ["run_name", "nodes", "size", "lr", "steps", "packing", "name", "stall_timeout"]
    assert fields["stall_timeout"]["type"] == "number" and fields["stall_timeout"]["value"] is None
    assert fields["size"]["type"] == "choice" and fields["size"]["options"] == ["7b", "13b"]
    assert fields["packing"]["type"] == "boolean" and fields["lr"]["type"] == "number"
    assert fields["name"]["required"]
    _records(hub, [_record("train-1", params={"size": "13b", "lr": 0.5, "name": "x"})])
    filled = {f["name"]: f["value"] for f in hub.form("train", run="train-1")["fields"]}
    assert filled["size"] == "13b" and filled["lr"] == 0.5 and filled["steps"] == 10


def test_a_submitted_form_is_checked_like_higgsfield_run(hub: Hub) -> None:
    plan = hub.plan("train", {"size": "13b", "lr": "0.01", "packing": True, "name": "a", "nodes": "1",
                              "run_name": "mine"})
    assert plan.params["size"] == "13b" and plan.params["lr"] == 0.01 and plan.params["packing"] is True
    assert plan.run == "mine" and [n.name for n in plan.nodes] == ["localhost"]
    assert plan.stall.stall_timeout == 600.0   # an empty field: higgsfield.yml's
    assert hub.plan("train", {"name": "a", "stall_timeout": "30"}).stall.stall_timeout == 30.0
    cases: list[tuple[dict[str, Any], str]] = [
        ({"name": "a", "size": "70b"}, "size"),
        ({"name": "a", "lr": "fast"}, "lr"),
        ({}, "'name' is required"),
        ({"name": "a", "nodes": "3"}, "nodes must be between 1 and 2"),
        ({"name": "a", "run_name": "../etc"}, "run_name"),
        ({"name": "a", "stall_timeout": "-1"}, "stall_timeout must be a number of seconds >= 0"),
    ]
    for values, needle in cases:
        with pytest.raises(ParamError) as e:
            hub.plan("train", values)
        assert needle in str(e.value) and "\n" not in str(e.value), (values, e.value)
    with pytest.raises(HiggsfieldError, match="no form field 'bogus'"):
        hub.plan("train", {"name": "a", "bogus": "1"})
    with pytest.raises(HiggsfieldError, match="nope"):
        hub.plan("nope", {})


@pytest.mark.parametrize("preflight", [True, False])
def test_a_start_from_the_page_preflights_when_higgsfield_yml_says_so(hub: Hub, monkeypatch: pytest.MonkeyPatch,
                                                                      preflight: bool) -> None:
    """'preflight: true' holds for the page's runs: the node it passes over is left out, and said so."""
    import asyncio
    from types import SimpleNamespace

    import higgsfield.control.doctor.preflight as pf

    yml = hub.cfg.project_dir / "higgsfield.yml"
    yml.write_text(yml.read_text() + f"preflight: {str(preflight).lower()}\n")
    hub = Hub(load_config(yml))
    tested: list[tuple[tuple[str, ...], int | None]] = []

    def fabric(cfg: Any, *, exclude: tuple[str, ...] = (), count: int | None = None) -> Any:
        # the real fabric test needs the nodes: tests/provision/test_doctor_fabric.py runs it on the bed
        tested.append((exclude, count))
        return pf.Preflight(("localhost",), ["preflight: localhost is slow: passed over"])

    started: list[list[str]] = []

    class Session:
        async def start(self, plan: Any, secrets: Any = None) -> Any:
            started.append([str(n.name) for n in plan.nodes])
            return SimpleNamespace(run=plan.run, nodes=started[-1], job_id=None)

    monkeypatch.setattr(pf, "preflight", fabric)
    monkeypatch.setattr(hub, "fleet", SimpleNamespace(session=lambda nodes: Session(), learn=lambda handle: None))
    out = asyncio.run(hub.start_run("train", {"name": "a", "nodes": "1", "run_name": "p1"}))
    if preflight:
        assert tested == [((), 1)] and started == [["gpu-2.example.com"]]
        assert out["where"].endswith("(passed over by the preflight: localhost)"), out
    else:
        assert tested == [] and started == [["localhost"]] and "preflight" not in out["where"]
    with pytest.raises(ParamError):   # a bad form is refused before any fabric test
        asyncio.run(hub.start_run("train", {"name": "a", "lr": "fast"}))
    assert len(tested) == (1 if preflight else 0)


def test_the_page_sees_status_json_and_queue_places_but_no_internals(hub: Hub) -> None:
    _records(hub, [_record("train-1", state="running", slots=[0, 1]),
                   _record("train-2", state="queued", created=2.0)],
             queue=[{"project": "hubproj", "run": "train-1", "want": 2, "slots": [0, 1], "committed": True},
                    {"project": "other", "run": "x", "want": 1, "slots": None, "committed": False},
                    {"project": "hubproj", "run": "train-2", "want": 2, "slots": None, "committed": False}])
    runs = hub.runs_payload()["runs"]
    assert [r["run"] for r in runs] == ["train-1", "train-2"]
    first, second = runs
    assert first["state"] == "running" and first["queue_position"] is None
    assert first["queue"]["localhost"]["slots"] == [0, 1]
    assert second["queue_position"] == 2   # another project's waiter is ahead: they wait for the same slots
    text = repr(hub.runs_payload()) + repr(hub.nodes_payload())
    for internal in ("command", "pids", "pid_starts", "container", SECRET):
        assert internal not in text
    assert set(first) >= {"version", "project", "experiment", "run", "state", "nodes", "failed_node",
                          "failed_rank", "error_tail", "params"}
    assert first["node_records"] == {"localhost": {"state": "running", "slots": [0, 1], "exit_code": None,
                                                   "started_at": 1.0, "ended_at": None, "reason": None,
                                                   "exclusive": False, "nproc": 2}}
    assert list(first)[-10:] == ["node_states", "stragglers", "attempts", "recoveries", "lost", "node_records",
                                 "stalled_at", "stale_nodes", "queue", "queue_position"]
    assert first["queue"] == {"localhost": {"position": 0, "slots": [0, 1], "want": 2, "committed": True}}
    node = hub.nodes_payload()["nodes"][0]
    assert list(node) == ["name", "host", "state", "reason", "since", "sample", "history", "queue", "skipped",
                          "drift", "fabric"]
    assert node["queue"][1] == {"project": "other", "run": "x", "want": 1, "slots": None, "committed": False}


def test_the_page_gets_the_run_states_from_the_contract(hub: Hub) -> None:
    """The state filter's options are states.STATES, served with the session; the script writes none of them."""
    with TestClient(create_app(hub, "t0ken")) as client:
        session = client.get("/api/session").json()
    assert session["states"] == list(states.STATES)
    script = (STATIC / "app.js").read_text()
    listed = [m for m in re.findall(r"\[([^\[\]]*)\]", script)
              if all(f'"{s}"' in m or f"'{s}'" in m for s in states.STATES)]
    assert not listed, f"app.js lists the run states itself (take them from /api/session's states): {listed}"


def test_ui_refuses_a_bad_or_busy_port_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "higgsfield.yml").write_text(f"name: p\nnodes:\n  - host: localhost\nstate_dir: {tmp_path}/s\n")

    def ui(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "higgsfield", "ui", "--no-browser", *args], cwd=tmp_path,
                              env=cli_env(tmp_path / "h"), capture_output=True, text=True, timeout=30)

    r = ui("--port", "70000")
    assert (r.returncode, r.stderr) == (2, "error: --port 70000 is not a TCP port (0-65535; 0 picks a free one)\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = ui("--port", str(port))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr == f"error: port {port} on 127.0.0.1 is in use: pick another with --port (or --port 0)\n"


# -- helpers ------------------------------------------------------------------------------------

def _record(run: str, *, state: str = "succeeded", slots: list[int] | None = None, created: float = 1.0,
            params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"project": "hubproj", "experiment": "train", "run": run, "node": "localhost", "node_rank": 0,
            "nnodes": 1, "nproc": 2, "state": state, "slots": slots or [], "created_at": created,
            "started_at": created if state != "queued" else None, "ended_at": None, "exit_code": None,
            "command": ["torchrun", "--secret-looking-arg"], "pids": {"supervisor": 1}, "pid_starts": {},
            "container": "c", "params": params or {"size": "7b"}}


def _records(hub: Hub, records: list[dict[str, Any]], queue: list[dict[str, Any]] | None = None) -> None:
    """What the nodes' feeds would have brought: node 0 holds the records (and its queue)."""
    st = hub.fleet.feeds[0].state  # type: ignore[attr-defined]  # SSH nodes: a NodesFleet
    st.state = "up"
    line = FeedLine.parse(json.dumps({"runs": records, "full": True, "queue": queue or []}))   # decoded as the feed is
    assert line is not None and line.runs is not None and line.queue is not None
    st.records = {v.run: v for v in line.runs}
    st.queue = line.queue

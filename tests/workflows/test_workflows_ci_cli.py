"""`higgsfield ci deploy | run | kill` read the job's environment and call the project's backend.

The fast tests swap the backend for a recorder (what exactly is it called with?);
the slow one launches and kills a real run on a localhost node, as a job would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from wf_helpers import make_project

import higgsfield.control.backends as backends
from higgsfield.contract.errors import RunError
from higgsfield.control.cli import main


@pytest.fixture()
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checked-out project in a job's environment: key file written, known_hosts committed."""
    proj = make_project(tmp_path / "proj")
    (proj / ".higgsfield").mkdir()
    (proj / ".higgsfield" / "known_hosts").write_text("gpu-1.example.com ssh-ed25519 AAAA\n")
    key = tmp_path / "runner-temp" / "higgsfield_ssh_key"
    key.parent.mkdir()
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    key.chmod(0o600)
    for k in list(os.environ):
        if k.startswith(("HIGGSFIELD_", "GITHUB_")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HIGGSFIELD_SSH_KEY_FILE", str(key))
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_SHA", "0123456789abcdef0123")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    monkeypatch.chdir(proj)
    return proj


class Recorder:
    """A backend that records its calls: ``start``/``kill``/``deploy`` are the test's functions."""

    name = "recorder"

    def __init__(self, cfg: Any, start: Any = None, kill: Any = None, deploy: Any = None) -> None:
        self.cfg, self._start, self._kill, self._deploy = cfg, start, kill, deploy

    def plan(self, request: Any) -> Any:
        return request

    def describe(self, handle: Any) -> str:
        return f"on {', '.join(handle.nodes)}"

    def deploy(self, **kw: Any) -> Any:
        return self._deploy(self.cfg, **kw)

    def session(self, plan: Any = None) -> Any:
        backend = self

        class Session:
            async def __aenter__(self) -> Any:
                return self

            async def __aexit__(self, *exc: Any) -> None:
                return None

            async def start(self, plan: Any, secrets: Any = None) -> Any:
                return backend._start(backend.cfg, plan.experiment, dict(plan.params), run_name=plan.run_name,
                                      nodes=plan.nodes, secrets=secrets, exclude=plan.exclude)

            async def kill(self, target: str) -> Any:
                return backend._kill(backend.cfg, target)

        return Session()


def recording(monkeypatch: pytest.MonkeyPatch, **fns: Any) -> None:
    monkeypatch.setattr(backends, "backend_for", lambda cfg: Recorder(cfg, **fns))


def cli(*args: str) -> int:
    try:
        main(list(args))
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def set_form(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name in ("lr", "steps", "size", "shards", "fast", "data", "note", "on"):
        monkeypatch.setenv(f"HIGGSFIELD_PARAM_{name}", values.pop(name, ""))
    for k, v in values.items():
        monkeypatch.setenv(k, v)


def test_ci_run_launches_with_the_form_values(job: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[dict[str, Any]] = []

    def start_run(cfg: Any, experiment: str, params: dict[str, str], **kw: Any) -> Any:
        calls.append({"cfg": cfg, "experiment": experiment, "params": params, **kw})
        return SimpleNamespace(run=kw["run_name"] or "alpaca-gen", nodes=["gpu-1.example.com"], job_id=None)

    recording(monkeypatch, start=start_run)
    set_form(monkeypatch, lr="0.5", fast="true", data="d.jsonl", size="", HIGGSFIELD_RUN_NAME="sweep1",
             HIGGSFIELD_NODES="1", WANDB_API_KEY="wandb-secret-123", HF_TOKEN="hf-secret-456")
    assert cli("ci", "run", "alpaca") == 0
    (call,) = calls
    assert call["experiment"] == "alpaca" and call["run_name"] == "sweep1" and call["nodes"] == 1
    assert call["params"] == {"lr": "0.5", "fast": "true", "data": "d.jsonl", "note": ""}   # note: cleared
    assert call["secrets"] == {"WANDB_API_KEY": "wandb-secret-123", "HF_TOKEN": "hf-secret-456"}
    assert call["cfg"].ssh.identity_file == os.environ["HIGGSFIELD_SSH_KEY_FILE"]
    out = capsys.readouterr().out
    assert "started run 'sweep1' of experiment 'alpaca' on 1 node: gpu-1.example.com" in out
    assert "higgsfield logs sweep1 -f" in out and "fast=True" in out and "lr=0.5" in out
    assert "secret-" not in out
    assert "sweep1" in Path(os.environ["GITHUB_STEP_SUMMARY"]).read_text()


@pytest.mark.parametrize("preflight", [True, False])
def test_ci_run_preflights_when_higgsfield_yml_says_so(job: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str], preflight: bool) -> None:
    """'preflight: true' holds for the form's runs too: the slow node it names is passed over, and said so."""
    import higgsfield.control.doctor.preflight as pf

    tested: list[tuple[list[str], tuple[str, ...], int | None]] = []

    def fabric(cfg: Any, *, exclude: tuple[str, ...] = (), count: int | None = None) -> Any:
        # the real fabric test needs the nodes: tests/provision/test_doctor_fabric.py runs it on the bed
        tested.append(([str(n.name) for n in cfg.nodes], exclude, count))
        return pf.Preflight(("gpu-2.example.com:2201",), ["preflight: gpu-2.example.com:2201 is slow: passed over"])

    calls: list[dict[str, Any]] = []

    def start_run(cfg: Any, experiment: str, params: dict[str, str], **kw: Any) -> Any:
        calls.append(kw)
        return SimpleNamespace(run="p1", nodes=["gpu-1.example.com"], job_id=None)

    monkeypatch.setattr(pf, "preflight", fabric)
    recording(monkeypatch, start=start_run)
    (job / "higgsfield.yml").write_text((job / "higgsfield.yml").read_text() + f"preflight: {str(preflight).lower()}\n")
    set_form(monkeypatch, data="d", HIGGSFIELD_NODES="1", WANDB_API_KEY="w", HF_TOKEN="h")
    assert cli("ci", "run", "alpaca") == 0
    (call,) = calls
    captured = capsys.readouterr()
    if preflight:
        assert tested == [(["gpu-1.example.com", "gpu-2.example.com:2201"], (), 1)]
        assert call["exclude"] == ("gpu-2.example.com:2201",)
        assert "preflight: gpu-2.example.com:2201 is slow: passed over" in captured.err
        assert "passed over by the preflight: gpu-2.example.com:2201" in captured.out
    else:
        assert tested == [] and call["exclude"] == ()
        assert "preflight" not in captured.out + captured.err


def test_ci_run_fails_the_job_with_one_annotation(job: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    def start_run(*a: Any, **kw: Any) -> Any:
        raise RunError("run 'x' failed to start on 1 node(s): gpu-2: no space left")

    recording(monkeypatch, start=start_run)
    set_form(monkeypatch, data="d", WANDB_API_KEY="w", HF_TOKEN="h")
    assert cli("ci", "run", "alpaca") == 1
    captured = capsys.readouterr()
    assert captured.out.strip().splitlines()[-1] == (
        "::error title=higgsfield ci run::run 'x' failed to start on 1 node(s): gpu-2: no space left")
    assert captured.err == "error: run 'x' failed to start on 1 node(s): gpu-2: no space left\n"


def test_ci_run_refuses_bad_input_before_launching(job: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    recording(monkeypatch, start=lambda *a, **k: pytest.fail("launched"))
    set_form(monkeypatch, data="d", steps="1e3x", WANDB_API_KEY="w", HF_TOKEN="h")
    assert cli("ci", "run", "alpaca") == 2
    assert "param 'steps': expected an integer" in capsys.readouterr().err
    set_form(monkeypatch, data="d", HF_TOKEN="h", WANDB_API_KEY="")
    assert cli("ci", "run", "alpaca") == 2
    assert "WANDB_API_KEY" in capsys.readouterr().err
    monkeypatch.setenv("WANDB_API_KEY", "w")
    monkeypatch.setenv("HIGGSFIELD_SSH_KEY_FILE", str(job / "nope"))
    assert cli("ci", "run", "alpaca") == 2
    assert "cannot read the SSH key" in capsys.readouterr().err


def test_ci_kill_reads_the_target(job: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    targets: list[str] = []

    def kill(cfg: Any, target: str) -> list[Any]:
        targets.append(target)
        return [SimpleNamespace(run="alpaca-1", state="killed")]

    recording(monkeypatch, kill=kill)
    monkeypatch.setenv("HIGGSFIELD_KILL_TARGET", "alpaca")
    assert cli("ci", "kill") == 0
    assert cli("ci", "kill", "--", "alpaca-1") == 0
    assert targets == ["alpaca", "alpaca-1"]
    assert "alpaca-1: killed" in capsys.readouterr().out
    assert cli("ci", "kill", "--", "$(id)") == 2


def test_ci_deploy(job: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[dict[str, Any]] = []

    def deploy(cfg: Any, **kw: Any) -> Any:
        calls.append({"cfg": cfg, **kw})
        return SimpleNamespace()

    recording(monkeypatch, deploy=deploy)
    assert cli("ci", "deploy") == 0
    (call,) = calls
    assert call["dirty"] is False and call["cfg"].ssh.identity_file == os.environ["HIGGSFIELD_SSH_KEY_FILE"]
    out = capsys.readouterr().out
    assert "deployed 0123456789ab of 'demo' to 2 nodes: gpu-1.example.com, gpu-2.example.com:2201" in out


PROBE = '''
import os, time
from higgsfield.experiment import experiment, param

@experiment("probe")
@param("flag", default=True)
@param("sleep", default=0.0)
@param("tag", default="plain")
def probe(params):
    print(f"rank={params.rank} flag={params.flag!r} sleep={params.sleep!r} tag={params.tag!r} "
          f"secret_len={len(os.environ.get('HF_TEST_SECRET', ''))}", flush=True)
    end = time.time() + params.sleep
    while time.time() < end:
        time.sleep(0.05)
'''


@pytest.mark.slow
def test_ci_run_and_kill_on_a_local_node(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "probe.py").write_text(PROBE)
    (proj / "higgsfield.yml").write_text(
        "name: localproj\nnodes:\n  - host: localhost\nnproc_per_node: 2\nruntime: process\n"
        f"state_dir: {tmp_path / 'state'}\nsecrets: [HF_TEST_SECRET]\n")
    marker = tmp_path / "pwned"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HIGGSFIELD_", "GITHUB_"))}
    env.update({"GITHUB_ACTIONS": "true", "HIGGSFIELD_RUN_NAME": "ci1", "HIGGSFIELD_NODES": "",
                "HIGGSFIELD_PARAM_flag": "false", "HIGGSFIELD_PARAM_sleep": "60",
                "HIGGSFIELD_PARAM_tag": f"$(touch {marker})", "HF_TEST_SECRET": "s3cr3t-value-xyz",
                "HIGGSFIELD_STALL_TIMEOUT": "45"})

    def hf(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=proj, env={**env, **extra},
                              capture_output=True, text=True, timeout=180)

    r = hf("ci", "run", "probe")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "started run 'ci1' of experiment 'probe' on 1 node: localhost" in r.stdout
    assert "higgsfield logs ci1 -f" in r.stdout
    logs = tmp_path / "state" / "runs" / "localproj" / "ci1" / "logs"
    deadline = time.time() + 90
    text = ""
    while time.time() < deadline:
        text = "".join(p.read_text(errors="replace") for p in logs.glob("rank*.log")) if logs.is_dir() else ""
        if text.count("secret_len=16") == 2:
            break
        time.sleep(0.2)
    assert f"flag=False sleep=60.0 tag='$(touch {marker})' secret_len=16" in text, text
    spec = json.loads((logs.parent / "spec.json").read_text())   # the form's stall timeout reached the node
    assert (spec["stall_timeout"], spec.get("on_stall", "fail")) == (45.0, "fail")
    k = hf("ci", "kill", HIGGSFIELD_KILL_TARGET="ci1")
    assert k.returncode == 0, k.stdout + k.stderr
    assert "ci1: killed" in k.stdout
    assert not marker.exists()
    k = hf("ci", "kill", HIGGSFIELD_KILL_TARGET="nosuch")
    assert k.returncode == 2 and k.stdout.startswith("::error title=higgsfield ci kill::no run or experiment")

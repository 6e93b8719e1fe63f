"""Execute the generated jobs' ``run:`` scripts in bash, as a runner would, with hostile form values.

A small stand-in for the runner: ``env:`` expressions are evaluated from a fake
context (inputs, secrets, runner.temp), each script runs under ``bash -eo pipefail``
and ``higgsfield`` / ``python`` are stubs that record their argv and environment.
Whatever the values, they must reach the command as data: no marker file appears.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from wf_helpers import load, make_project

from higgsfield import __version__
from higgsfield.control.config import load_config
from higgsfield.control.project.discovery import discover
from higgsfield.control.workflows import render_workflows

STUB = """#!{python}
import json, os, stat, sys
key = os.environ.get("HIGGSFIELD_SSH_KEY_FILE", "")
info = {{"prog": os.path.basename(sys.argv[0]), "argv": sys.argv[1:],
         "env": {{k: v for k, v in os.environ.items() if k.startswith(("HIGGSFIELD_", "WANDB", "HF_", "SSH_"))}}}}
if key and os.path.exists(key):
    info["key_mode"] = oct(stat.S_IMODE(os.stat(key).st_mode))
    info["key_text"] = open(key).read()
with open({log!r}, "a") as f:
    f.write(json.dumps(info) + "\\n")
"""
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
BASH = shutil.which("bash") or "/bin/bash"


class Runner:
    def __init__(self, tmp: Path, inputs: dict[str, str], secrets: dict[str, str]) -> None:
        self.tmp, self.inputs, self.secrets = tmp, inputs, secrets
        self.bin = tmp / "bin"
        self.bin.mkdir(parents=True)
        self.log = tmp / "calls.jsonl"
        self.temp = tmp / "runner-temp"
        self.temp.mkdir()
        self.stdout = ""
        for prog in ("higgsfield", "python"):
            p = self.bin / prog
            p.write_text(STUB.format(python=sys.executable, log=str(self.log)))
            p.chmod(0o755)

    def expr(self, text: str) -> str:
        if text == "runner.temp":
            return str(self.temp)
        if m := re.fullmatch(r"inputs\.(\w+)", text):
            return self.inputs.get(m.group(1), "")
        if m := re.fullmatch(r"secrets\.(\w+)", text):
            return self.secrets.get(m.group(1), "")
        if m := re.fullmatch(r"secrets\.(\w+) != ''", text):
            return "true" if self.secrets.get(m.group(1), "") != "" else "false"
        raise AssertionError(f"unexpected expression in env: {text}")

    def job(self, workflow: dict[str, Any], name: str) -> dict[str, str]:
        """Run the job's scripts in order; returns its step outputs."""
        outputs: dict[str, str] = {}
        for step in workflow["jobs"][name]["steps"]:
            if "run" not in step:
                continue
            env = {"PATH": f"{self.bin}:/usr/bin:/bin", "HOME": str(self.tmp), "RUNNER_TEMP": str(self.temp)}
            out_file = self.tmp / "github_output"
            out_file.write_text("")
            env["GITHUB_OUTPUT"] = str(out_file)
            for key, value in (step.get("env") or {}).items():
                env[key] = EXPR.sub(lambda m: self.expr(m.group(1)), str(value))
            r = subprocess.run([BASH, "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
                               env=env, cwd=self.tmp, capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, (step, r.stdout, r.stderr)
            self.stdout += r.stdout
            for line in out_file.read_text().splitlines():
                k, _, v = line.partition("=")
                outputs[k] = v
        return outputs

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, dict[str, Any]]:
    proj = make_project(tmp_path / "proj", marker=tmp_path / "pwned")
    cfg = load_config(proj / "higgsfield.yml")
    return {k: load(v) for k, v in render_workflows(cfg, discover(proj / "src")).items()}


def hostile(marker: Path) -> list[str]:
    return [f'"; touch {marker} #', f"$(touch {marker})", f"`touch {marker}`", f"'; touch {marker}; '",
            f"x\ntouch {marker}", "${{ secrets.SSH_KEY }}", f"--help; touch {marker}", "%0A::error::x"]


@pytest.mark.parametrize("index", range(8))
def test_run_job_passes_hostile_values_as_data(tmp_path: Path, files: dict[str, dict[str, Any]],
                                               index: int) -> None:
    marker = tmp_path / "pwned"
    value = hostile(marker)[index]
    inputs = {"run_name": value, "nodes": "", "lr": "0.01", "steps": "", "size": "13b", "shards": "4",
              "fast": "true", "data": value, "note": value, "on": "false"}
    runner = Runner(tmp_path / "runner", inputs, {"SSH_KEY": "-----KEY-----", "WANDB_API_KEY": "w4ndb"})
    runner.job(files["run_alpaca.yml"], "run")
    assert not marker.exists()
    pip, ci = runner.calls()
    assert pip["prog"] == "python"
    assert pip["argv"] == ["-m", "pip", "install", "--disable-pip-version-check", f"higgsfield=={__version__}"]
    assert ci["prog"] == "higgsfield" and ci["argv"] == ["ci", "run", "alpaca"]
    env = ci["env"]
    assert env["HIGGSFIELD_PARAM_note"] == value and env["HIGGSFIELD_PARAM_data"] == value
    assert env["HIGGSFIELD_RUN_NAME"] == value
    assert env["HIGGSFIELD_PARAM_fast"] == "true" and env["HIGGSFIELD_PARAM_steps"] == ""
    assert env["WANDB_API_KEY"] == "w4ndb" and env["HF_TOKEN"] == ""
    assert "SSH_KEY" not in env                     # the key reaches the command only as a file
    assert ci["key_mode"] == "0o600" and ci["key_text"] == "-----KEY-----\n"
    assert list(runner.temp.iterdir()) == []         # removed at the end of the job


def test_kill_job_passes_the_target_after_double_dash(tmp_path: Path, files: dict[str, dict[str, Any]]) -> None:
    marker = tmp_path / "pwned"
    for i, value in enumerate(hostile(marker)):
        runner = Runner(tmp_path / f"r{i}", {"target": value}, {"SSH_KEY": "k"})
        runner.job(files["kill.yml"], "kill")
        ci = runner.calls()[-1]
        assert ci["argv"] == ["ci", "kill", "--", value]
    assert not marker.exists()


def test_deploy_without_ssh_key_ends_with_a_notice(tmp_path: Path, files: dict[str, dict[str, Any]]) -> None:
    deploy = files["deploy.yml"]
    runner = Runner(tmp_path / "r", {}, {})
    outputs = runner.job(deploy, "secrets")
    assert outputs == {"ready": "false"}
    notice = [line for line in runner.stdout.splitlines() if line.startswith("::notice")]
    assert len(notice) == 1 and "SSH_KEY is not set" in notice[0] and "WANDB_API_KEY, HF_TOKEN" in notice[0]
    assert runner.calls() == []
    # the deploy job is skipped by its `if:`, so the run ends green with the notice


def test_deploy_with_ssh_key_runs_ci_deploy(tmp_path: Path, files: dict[str, dict[str, Any]]) -> None:
    deploy = files["deploy.yml"]
    runner = Runner(tmp_path / "r", {}, {"SSH_KEY": "-----KEY-----\n", "WANDB_API_KEY": "w"})
    assert runner.job(deploy, "secrets") == {"ready": "true"}
    assert "::notice" not in runner.stdout
    runner.job(deploy, "deploy")
    ci = runner.calls()[-1]
    assert ci["argv"] == ["ci", "deploy"] and ci["key_mode"] == "0o600"
    assert "WANDB_API_KEY" not in ci["env"]           # deploys need no run secrets

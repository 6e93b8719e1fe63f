"""``higgsfield setup`` rendering and exit codes, with stand-in steps on a localhost node."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from higgsfield.cli import cli
from higgsfield.errors import StepFailed
from higgsfield.provision import Check, Step
from higgsfield.provision import runner as runner_mod
from higgsfield.provision.context import NodeContext


class _Done(Step):
    name = "os"
    title = "os"

    async def check(self, ctx: NodeContext) -> Check:
        return Check(True, "fine")


class _Broken(Step):
    name = "docker"
    title = "docker"

    async def check(self, ctx: NodeContext) -> Check:
        raise StepFailed("docker is broken here")


def _project(tmp_path: Path) -> Path:
    (tmp_path / "higgsfield.yml").write_text("name: p\nnodes:\n  - host: localhost\n")
    return tmp_path / "higgsfield.yml"


def test_all_done_exits_0_and_says_nothing_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_mod, "STEPS", (_Done(),))
    res = CliRunner().invoke(cli, ["--config", str(_project(tmp_path)), "setup"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "every step was already done, nothing changed" in res.output


def test_a_failure_is_named_and_exits_non_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from higgsfield.errors import GroupError

    monkeypatch.setattr(runner_mod, "STEPS", (_Done(), _Broken()))
    res = CliRunner().invoke(cli, ["--config", str(_project(tmp_path)), "setup"])
    assert isinstance(res.exception, GroupError) and "setup failed on 1 of 1 node(s): localhost" in str(res.exception)
    assert "✗ localhost: docker: docker is broken here (full output: " in res.output
    assert "logs/setup/localhost.log" in res.output

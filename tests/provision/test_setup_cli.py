"""``higgsfield setup`` rendering and exit codes, with stand-in steps on a localhost node."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
from click.testing import CliRunner

from higgsfield.contract.errors import StepFailed
from higgsfield.control.cli import cli
from higgsfield.control.provision import Check, Step
from higgsfield.control.provision import runner as runner_mod
from higgsfield.control.provision.context import NodeContext


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
    from higgsfield.contract.errors import GroupError

    monkeypatch.setattr(runner_mod, "STEPS", (_Done(), _Broken()))
    res = CliRunner().invoke(cli, ["--config", str(_project(tmp_path)), "setup"])
    assert isinstance(res.exception, GroupError) and "setup failed on 1 of 1 node(s): localhost" in str(res.exception)
    assert "✗ localhost: docker: docker is broken here (full output: " in res.output
    assert "logs/setup/localhost.log" in res.output


class _PerNode(Step):
    """Applies something whose note names the node and its user, and is in place afterwards."""

    name = "docker-group"
    title = "docker group"
    done: ClassVar[set[str]] = set()

    async def check(self, ctx: NodeContext) -> Check:
        return Check(ctx.name in _PerNode.done, f"{await ctx.user()} ok on {ctx.name}")

    async def apply(self, ctx: NodeContext) -> str:
        _PerNode.done.add(ctx.name)
        return f"added {await ctx.user()} to the docker group on {ctx.name}"


def test_an_applied_steps_detail_is_said_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import getpass

    _PerNode.done = set()
    monkeypatch.setattr(runner_mod, "STEPS", (_Done(), _PerNode()))
    res = CliRunner().invoke(cli, ["--config", str(_project(tmp_path)), "setup"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert f"docker-group applied: added {getpass.getuser()} to the docker group on localhost (localhost)" \
        in res.output
    assert "ok on localhost" not in res.output  # what verify found is in the node's log, not said again
    log = (tmp_path / ".higgsfield" / "logs" / "setup" / "localhost.log").read_text()
    assert "## docker-group: verified: " in log and "ok on localhost" in log


def test_notes_that_differ_only_in_the_user_or_node_are_one_line() -> None:
    from rich.console import Console

    from higgsfield.control.cli.nodes import _render_setup
    from higgsfield.control.provision import NodeReport, Outcome, SetupReport, StepResult

    def node(i: int) -> NodeReport:
        return NodeReport(f"hfnode{i}", i, [StepResult("docker-group", Outcome.APPLIED,
                                                       f"added ceof{i} to the docker group; reconnected")],
                          user=f"ceof{i}")

    console = Console(width=200, record=True, color_system=None)
    _render_setup(console, SetupReport([node(i) for i in range(30, 46)], ["docker-group"]))
    notes = [ln for ln in console.export_text().splitlines() if "added" in ln]
    assert notes == ["docker-group applied: added <user> to the docker group; reconnected (all nodes)"]
    console = Console(width=200, record=True, color_system=None)
    done = NodeReport("gpu-x", 0, [StepResult("docker-group", Outcome.DONE, "ceof ok")], user="ceof")
    _render_setup(console, SetupReport([node(i) for i in range(30, 33)] + [node(7), done], ["docker-group"]))
    notes = [ln for ln in console.export_text().splitlines() if "added" in ln]
    assert notes == ["docker-group applied: added <user> to the docker group; reconnected (hfnode30..hfnode32, "
                     "hfnode7)"]


def test_merge_notes_by_user_and_node_and_name_runs_of_nodes() -> None:
    from higgsfield.control.cli.nodes import _nodes_named, merge_notes

    notes = [(f"added ceof{i} to the docker group", f"hfnode{i}", {"<user>": f"ceof{i}", "<node>": f"hfnode{i}"})
             for i in range(30, 46)]
    notes.append(("added ceof9 to the docker group (was in 'ceof9x')", "gpu-a", {"<user>": "ceof9", "<node>": "gpu-a"}))
    merged = merge_notes(notes)
    assert merged[0] == ("added <user> to the docker group", [f"hfnode{i}" for i in range(30, 46)])
    assert merged[1] == ("added ceof9 to the docker group (was in 'ceof9x')", ["gpu-a"])  # alone: as it was
    assert _nodes_named([f"hfnode{i}" for i in range(30, 46)], 17) == "hfnode30..hfnode45"
    assert _nodes_named(["a1", "a2", "b", "a4", "a5", "a6"], 9) == "a1, a2, b, a4..a6"
    assert _nodes_named(["x", "y"], 2) == "all nodes"


def test_the_live_table_does_not_shift_as_cells_fill() -> None:
    from rich.console import Console

    from higgsfield.control.cli.nodes import _progress_table

    nodes, steps = ["gpu-1", "a-much-longer-node"], ["connect", "os", "docker-group", "base-image"]

    def header(state: dict[tuple[str, str], tuple[str, str]], dry_run: bool = False) -> str:
        console = Console(width=200, record=True, color_system=None)
        console.print(_progress_table(nodes, steps, state, dry_run))
        return console.export_text().splitlines()[1]  # the top border: where every column starts and ends

    empty = header({})
    full = header({(n, s): ("not run", "") for n in nodes for s in steps})
    assert empty == full
    assert header({}, dry_run=True) == header({(n, "os"): ("would apply", "") for n in nodes}, dry_run=True)

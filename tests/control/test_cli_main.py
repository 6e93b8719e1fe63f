"""``higgsfield.control.cli.main``: unexpected errors are one line, a closed pipe ends quietly with 141."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest

from higgsfield.control import cli as cli_mod

SPAM = """
import click
from higgsfield.control import cli

@click.command("spam")
def spam():
    for i in range(200000):
        click.echo(f"line {i}")

cli.COMMANDS["spam"] = ("__main__", "spam", "x")
cli.main(["spam"])
"""


def test_closed_pipe_exits_141_without_a_traceback(tmp_path: Path) -> None:
    script = tmp_path / "spam.py"
    script.write_text(SPAM)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,  # noqa: S603
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # like `| head -1`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


@pytest.fixture
def boom(monkeypatch: pytest.MonkeyPatch) -> None:
    @click.command("boom")
    def _boom() -> None:
        raise ValueError("bad thing")

    monkeypatch.setitem(cli_mod.COMMANDS, "boom", (__name__, "BOOM", "x"))
    monkeypatch.setattr(sys.modules[__name__], "BOOM", _boom, raising=False)


def test_internal_error_is_one_line(boom: None, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HIGGSFIELD_DEBUG", raising=False)
    with pytest.raises(SystemExit) as ex:
        cli_mod.main(["boom"])
    assert ex.value.code == 1
    assert capsys.readouterr().err == ("error: internal error: ValueError: bad thing "
                                       "(re-run with --debug for the traceback)\n")
    with pytest.raises(ValueError, match="bad thing"):
        cli_mod.main(["--debug", "boom"])

"""The ``higgsfield`` command line: thin click commands over the library.

Commands live in small modules and are imported only when invoked, so
``higgsfield --help`` imports neither pydantic, rich, asyncssh nor torch.
Every command raises :class:`~higgsfield.contract.errors.HiggsfieldError` for user mistakes;
:func:`main` prints it as one line and exits with its ``exit_code`` (``--debug``
shows the traceback). Anything else is a bug: one "internal error" line, exit 1
(``--debug`` shows the traceback). Output into a closed pipe (``higgsfield logs RUN |
head``) ends quietly with exit 141, as a shell tool killed by SIGPIPE does.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from higgsfield import __version__
from higgsfield.control.cli._common import Options

# name -> (module, attribute, one-line help). Order here is the order in --help.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "init": ("higgsfield.control.cli.project", "init", "Scaffold a new project (config, src/, Dockerfile, deploy key)."),
    "config": ("higgsfield.control.cli.project", "config", "Validate higgsfield.yml or print its JSON Schema."),
    "show-deploy-key": ("higgsfield.control.cli.project", "show_deploy_key", "Print the public deploy key for GitHub."),
    "setup": ("higgsfield.control.cli.nodes", "setup", "Provision every node over SSH, concurrently."),
    "doctor": ("higgsfield.control.cli.nodes", "doctor", "Read-only preflight check of every node."),
    "build-experiments": ("higgsfield.control.cli.workflows", "build_experiments",
                          "Render GitHub Actions workflows for the experiments under src/."),
    "experiments": ("higgsfield.control.cli.workflows", "experiments", "List the experiments found under src/."),
    "deploy": ("higgsfield.control.cli.runs", "deploy", "Ship the committed code to every node and build the image."),
    "run": ("higgsfield.control.cli.runs", "run", "Run an experiment on the nodes and stream its logs."),
    "logs": ("higgsfield.control.cli.runs", "logs", "Show the merged logs of a run (-f to follow)."),
    "status": ("higgsfield.control.cli.runs", "status", "List runs and their state on every node."),
    "kill": ("higgsfield.control.cli.runs", "kill", "Stop a run on every node."),
    "stacks": ("higgsfield.control.cli.stacks", "stacks", "Show what every rank of a run is doing: its stacks, grouped."),
    "profile": ("higgsfield.control.cli.profile", "profile", "Profile the next N steps of every rank of a live run."),
    "data": ("higgsfield.control.cli.data", "data", "Send the data: entries (data, weights) to every node: data push."),
    "prune": ("higgsfield.control.cli.prune", "prune", "Free node disk: remove finished runs, unused images (--dry-run)."),
    "pull": ("higgsfield.control.cli.runs", "pull", "Bring a run's checkpoint (every node's part, merged) and logs home."),
    "metrics": ("higgsfield.control.cli.ui", "metrics", "Show a run's step metrics: loss, tokens/s, lr, MFU, memory."),
    "ui": ("higgsfield.control.cli.ui", "ui", "Serve the live web dashboard of runs, queue, nodes, logs and curves."),
    "ci": ("higgsfield.control.cli.ci", "ci", "Commands the generated GitHub Actions jobs run."),
    "invoker": ("higgsfield.node.cli", "invoker", "Node-side agent (used over SSH)."),
}
HIDDEN = {"invoker"}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module, attr, help_text = entry
        if ctx.resilient_parsing or _listing(ctx):
            # Listing commands for --help: a placeholder carries the help line without importing.
            return click.Command(cmd_name, help=help_text, short_help=help_text, hidden=cmd_name in HIDDEN)
        cmd = getattr(importlib.import_module(module), attr)
        if cmd_name in HIDDEN:
            cmd.hidden = True
        return cmd  # type: ignore[no-any-return]


def _listing(ctx: click.Context) -> bool:
    return bool(ctx.meta.get("higgsfield.listing"))


class _ClosedPipe(Exception):
    """stdout was closed by the reader; carried past click, which would turn it into exit 1."""


class _Root(LazyGroup):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as e:
            raise _ClosedPipe() from e

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        ctx.meta["higgsfield.listing"] = True
        try:
            super().format_commands(ctx, formatter)
        finally:
            ctx.meta["higgsfield.listing"] = False


@click.group(cls=_Root, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="higgsfield")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Path to higgsfield.yml (default: the nearest one at or above the current directory).")
@click.pass_context
def cli(ctx: click.Context, debug: bool, config_path: str | None) -> None:
    """higgsfield: multi-node LLM training without crying.

    \b
    higgsfield init my_llama         scaffold a project
    higgsfield setup                 provision every node in higgsfield.yml
    higgsfield build-experiments     GitHub Actions forms for your @experiments
    higgsfield run NAME -p k=v       train on every node, logs streamed here
    higgsfield logs NAME -f | status | kill NAME
    higgsfield ui                    the live dashboard in your browser
    """
    ctx.obj = Options(debug=debug, config_path=config_path)


def main(argv: list[str] | None = None) -> Any:
    from higgsfield.contract.errors import HiggsfieldError
    from higgsfield.contract.text import one_line

    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args or os.environ.get("HIGGSFIELD_DEBUG") == "1"
    try:
        return cli.main(args=args, prog_name="higgsfield", standalone_mode=False)
    except HiggsfieldError as e:
        if debug:
            raise
        click.echo(f"error: {one_line(str(e))}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.UsageError as e:
        # click's own form is four lines (usage, hint, blank, error); ours is the error and where help is.
        if debug:
            raise
        where = e.ctx.command_path if e.ctx is not None else "higgsfield"
        click.echo(f"error: {_click_message(e)} (see '{where} --help')", err=True)
        sys.exit(2)
    except click.ClickException as e:
        if debug:
            raise
        click.echo(f"error: {_click_message(e)}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except (BrokenPipeError, _ClosedPipe):
        _silence_stdout()
        sys.exit(141)
    except Exception as e:
        if debug:
            raise
        click.echo(f"error: internal error: {type(e).__name__}: {one_line(str(e), 500)} "
                   "(re-run with --debug for the traceback)", err=True)
        sys.exit(1)


def _click_message(e: click.ClickException) -> str:
    """click's message on one line, a word over 150 characters cut: click quotes the whole value it refused.

    (Our own messages quote values through ``shown``, already cut to about 60 characters.)
    """
    import re

    from higgsfield.contract.text import LIMIT, one_line

    text = one_line(e.format_message(), 400)
    return re.sub(r"\S{151,}", lambda m: f"{m.group()[:LIMIT]}… ({len(m.group())} chars)", text)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail on the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass

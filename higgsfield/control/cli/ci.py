"""``higgsfield ci deploy | run | kill``: what the generated GitHub Actions jobs run.

Each job installs higgsfield, writes the SSH_KEY secret to a mode-0600 file and calls
one of these. Inputs come from the environment the workflow sets (see
:mod:`higgsfield.control.workflows.ci_inputs`); the output is a short summary for the job log
(and the run page's summary), and any failure fails the job with one ``::error::`` line.

Try one locally, as the job would::

    HIGGSFIELD_SSH_KEY_FILE=~/.ssh/id_ed25519 HIGGSFIELD_PARAM_lr=0.01 higgsfield ci run alpaca
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from higgsfield.contract.errors import HiggsfieldError
from higgsfield.contract.text import one_line
from higgsfield.control.cli._common import console, get_config, preflight_exclude

if TYPE_CHECKING:
    from higgsfield.control.backends import Backend
    from higgsfield.control.backends.nodes import RunHandle, RunStatus
    from higgsfield.control.config import Config


class _CIGroup(click.Group):
    """Turns a failure into a GitHub error annotation, then lets the CLI print and exit as usual."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except HiggsfieldError as e:
            if _on_github(os.environ):
                click.echo(f"::error title=higgsfield ci {ctx.invoked_subcommand}::{_escape(one_line(str(e)))}")
            raise


@click.group(cls=_CIGroup)
def ci() -> None:
    """Commands the generated GitHub Actions jobs run (inputs come from the job's environment)."""


@ci.command("deploy")
@click.pass_context
def deploy(ctx: click.Context) -> None:
    """Ship the checked-out commit to every node and build the image (the Deploy workflow)."""
    from higgsfield.control.backends import backend_for
    from higgsfield.control.workflows.ci_inputs import ci_config

    cfg = ci_config(get_config(ctx), os.environ)
    result = backend_for(cfg).deploy(dirty=False, console=console(stderr=True))
    commit = getattr(result, "commit", None) or os.environ.get("GITHUB_SHA", "")
    nodes = [str(n.name) for n in (cfg.on_login_node() if cfg.slurm else cfg).nodes]
    lines = [f"deployed {commit[:12] or 'the checked-out code'} of '{cfg.name}' to {_count(nodes)}: "
             f"{', '.join(nodes)}",
             "start a run from the Actions tab ('Run <experiment>') or a laptop: higgsfield run EXPERIMENT"]
    _summary(lines, title=f"Deployed {cfg.name}")


@ci.command("run")
@click.argument("experiment")
@click.pass_context
def run(ctx: click.Context, experiment: str) -> None:
    """Launch EXPERIMENT with the values of the 'Run EXPERIMENT' form, detached, and print how to follow it."""
    from higgsfield.control import secrets
    from higgsfield.control.backends import RunRequest, backend_for
    from higgsfield.control.project.discovery import find_experiment
    from higgsfield.control.workflows.ci_inputs import ci_config, form_total_nodes, run_inputs

    _check_experiment_name(experiment)
    cfg = ci_config(get_config(ctx), os.environ)
    exp = find_experiment(cfg.project_dir / "src", experiment)
    inputs = run_inputs(exp, os.environ, total_nodes=form_total_nodes(cfg))
    if inputs.not_passed and _on_github(os.environ):
        click.echo(f"::warning title=higgsfield ci run::the workflow does not pass {', '.join(inputs.not_passed)} "
                   "(it is older than the experiment); they take their defaults. Run 'higgsfield "
                   "build-experiments' and commit .github/workflows")
    values = secrets.collect(cfg, os.environ)
    backend = backend_for(cfg)
    # 'preflight: true' holds for every run, the form's as much as a laptop's
    exclude = preflight_exclude(cfg, (), inputs.nodes) if cfg.preflight else ()
    plan = backend.plan(RunRequest(experiment, inputs.params, run_name=inputs.run_name, nodes=inputs.nodes,
                                   stall_timeout=inputs.stall_timeout, exclude=exclude))
    handle = asyncio.run(_start(backend, plan, values))
    name = handle.run
    nodes = list(handle.nodes)
    shown = ", ".join(f"{k}={v!r}" for k, v in inputs.typed.items()) or "(none)"
    where = backend.describe(handle) if handle.job_id else f"on {_count(nodes)}: {', '.join(nodes)}"
    lines = [f"started run '{name}' of experiment '{experiment}' {where}",
             *([f"passed over by the preflight: {', '.join(exclude)}"] if exclude else []),
             f"params: {shown}",
             f"follow its logs from a laptop:  higgsfield logs {name} -f",
             "see every run:                  higgsfield status",
             f"stop it:                        higgsfield kill {name}   (or the Kill workflow)"]
    _summary(lines, title=f"Run {name}")


@ci.command("kill")
@click.argument("target", required=False)
@click.pass_context
def kill(ctx: click.Context, target: str | None) -> None:
    """Stop TARGET, a run name or an experiment (its active runs), on every node (default: $HIGGSFIELD_KILL_TARGET)."""
    from higgsfield.control.workflows.ci_inputs import ci_config, kill_target

    name = kill_target(target, os.environ)
    cfg = ci_config(get_config(ctx), os.environ)
    stopped = asyncio.run(_kill(cfg, name))
    lines = [f"{r.run}: {r.state}" for r in stopped]
    lines.append("check with: higgsfield status")
    _summary(lines, title=f"Kill {name}")


async def _start(backend: Backend, plan: Any, values: dict[str, str]) -> RunHandle:
    async with backend.session(plan) as session:
        return await session.start(plan, secrets=values)


async def _kill(cfg: Config, target: str) -> list[RunStatus]:
    from higgsfield.control.backends import backend_for

    async with backend_for(cfg).session() as session:
        return await session.kill(target)


def _check_experiment_name(name: str) -> None:
    from higgsfield.contract.errors import ExperimentError
    from higgsfield.contract.names import check_identifier

    try:
        check_identifier(name, "experiment name")
    except ValueError as e:
        raise ExperimentError(str(e)) from None


def _summary(lines: list[str], title: str) -> None:
    """Print ``lines`` for the job log, and add them to the run page when GitHub gives a summary file."""
    for line in lines:
        click.echo(line)
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        body = "\n".join(f"    {line}" for line in lines)
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"### {title}\n\n{body}\n\n")


def _count(nodes: list[str]) -> str:
    return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"


def _on_github(environ: Mapping[str, str]) -> bool:
    return environ.get("GITHUB_ACTIONS") == "true"


def _escape(text: str) -> str:
    """A workflow-command message: %, CR and LF escaped so it stays one annotation."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")

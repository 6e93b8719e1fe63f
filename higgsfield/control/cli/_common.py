"""Small helpers shared by the CLI command modules (config loading, output)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from rich.console import Console

    from higgsfield.control.config import Config


@dataclass(frozen=True)
class Options:
    """The top-level options every command may need (the ``higgsfield`` group's object, found by type)."""

    debug: bool = False
    config_path: str | None = None


def get_config(ctx: click.Context) -> Config:
    """The project's config: --config, else the nearest higgsfield.yml at or above the cwd."""
    from higgsfield.control.config import load_config

    options = ctx.find_object(Options)
    path = options.config_path if options else None
    return load_config(Path(path) if path else None)


def console(stderr: bool = False) -> Console:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


# -- argument checks: a bad name is a usage error (exit 2) before any config is read or node contacted --

def experiment_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback: ``value`` is an experiment name (an identifier)."""
    from higgsfield.contract.names import check_identifier

    if value is None:
        return None
    try:
        return check_identifier(value, "experiment name")
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def run_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback: ``value`` is a run name (or an experiment name, which is one too)."""
    from higgsfield.contract.names import MAX_RUN_NAME, is_run_name
    from higgsfield.contract.text import shown

    if value is None or is_run_name(value):
        return value
    raise click.BadParameter(f"{shown(value)} is not a run or experiment name: use 1-{MAX_RUN_NAME} letters, "
                             "digits, '.', '_' or '-', starting with a letter or digit")


def preflight_exclude(cfg: Config, exclude: tuple[str, ...], nodes: int | None) -> tuple[str, ...]:
    """The fabric test first (``run --preflight``, ``preflight: true``, ``ci run``): its lines on stderr, and
    the run's ``exclude`` with the nodes it passes over added."""
    from rich.markup import escape

    from higgsfield.control.doctor.preflight import preflight

    if cfg.slurm is not None:  # the config refuses 'preflight: true' with a slurm block: only the flag gets here
        raise click.UsageError("--preflight is for SSH nodes: on a Slurm cluster the allocation picks the nodes "
                               "(doctor --fabric tests the partition; --exclude keeps a node out)")
    pre = preflight(cfg, exclude=exclude, count=nodes)
    err = console(stderr=True)
    for line in pre.lines:
        err.print(escape(line))
    return pre.exclude

"""Small helpers shared by the CLI command modules (config loading, output)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from rich.console import Console

    from higgsfield.config import Config


def get_config(ctx: click.Context) -> Config:
    """The project's config: --config, else the nearest higgsfield.yml at or above the cwd."""
    from higgsfield.config import load_config

    root = ctx.find_root()
    path = (root.obj or {}).get("config_path")
    return load_config(Path(path) if path else None)


def console(stderr: bool = False) -> Console:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)

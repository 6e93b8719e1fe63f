"""Project commands: ``init``, ``config check|schema``, ``show-deploy-key``.

Thin: the work is in :mod:`higgsfield.control.project.scaffold`, :mod:`higgsfield.control.config` and
:mod:`higgsfield.control.secrets`; these only parse arguments and print. Library modules
are imported inside the commands so that loading this module (for any of its
commands) stays cheap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from higgsfield.control.cli._common import get_config

if TYPE_CHECKING:
    from higgsfield.control.config import Config


@click.command()
@click.argument("name")
def init(name: str) -> None:
    """Scaffold project NAME in ./NAME, with a deploy key kept outside it.

    \b
    Creates higgsfield.yml, src/example.py, Dockerfile, requirements.txt,
    README.md, .gitignore, and the secrets file `env` (mode 0600).
    """
    from higgsfield.control.project.scaffold import init_project

    result = init_project(name, Path.cwd())
    key = result.key
    click.echo(f"Created project '{name}' in ./{name}")
    for rel in result.files:
        click.echo(f"  {rel}")
    if key is not None:
        verb = "created" if key.created else "reused (it already existed)"
        click.echo(f"Deploy key {verb}: {key.private_path}")
        click.echo(f"  public half: {key.public_path}  (`higgsfield show-deploy-key` prints it)")
    click.echo("")
    click.echo("Next:")
    click.echo(f"  cd {name}")
    click.echo("  higgsfield config check                  # one node, localhost, to start with")
    click.echo("  higgsfield run example                   # the example trains here")
    click.echo("  $EDITOR higgsfield.yml && higgsfield setup   # your GPU servers")


@click.group()
def config() -> None:
    """Validate higgsfield.yml or print its JSON Schema."""


@config.command("check")
@click.pass_context
def check(ctx: click.Context) -> None:
    """Validate higgsfield.yml and summarise it (nodes, ranks, secrets)."""
    from higgsfield.control.secrets import load_env_file

    cfg = get_config(ctx)
    env = load_env_file(cfg.env_file)
    for line in summary(cfg, env):
        click.echo(line)
    if cfg.env_file.is_file() and cfg.env_file.stat().st_mode & 0o077:
        click.echo(f"warning: {cfg.env_file} is readable by others: chmod 600 {cfg.env_file}", err=True)


def summary(cfg: Config, env: dict[str, str]) -> list[str]:
    """The lines ``config check`` prints: what the config means, secret values never shown."""
    lines = [f"{cfg.path}: ok", f"name:           {cfg.name}", f"nodes:          {len(cfg.nodes)}"]
    rows = []
    for rank, node in enumerate(cfg.nodes):
        if node.is_local:
            where = ("local", "-", "-")
        else:
            where = (node.host, str(cfg.node_port(node)), cfg.node_user(node))
        rows.append((str(rank), *where, str(node.name), "(master)" if rank == 0 else ""))
    header = ("rank", "host", "port", "user", "name", "")
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for r in (header, *rows):
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    lines.append(f"nproc_per_node: {cfg.nproc_per_node}")
    lines.append(f"runtime:        {cfg.runtime}")
    if not cfg.secrets:
        lines.append("secrets:        none")
    else:
        lines.append("secrets:")
        for s in cfg.secrets:
            state = "set in env" if env.get(s) else ("empty in env" if s in env else "not set in env")
            lines.append(f"  {s}: {state}")
    return lines


@config.command("schema")
def schema() -> None:
    """Print the JSON Schema of higgsfield.yml (for editors and CI validation)."""
    from higgsfield.control.config import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


@click.command("show-deploy-key")
@click.option("--generate", is_flag=True,
              help="Create the key pair when this project has none (e.g. a project cloned on a new machine).")
@click.pass_context
def show_deploy_key(ctx: click.Context, generate: bool) -> None:
    """Print the public half of this project's deploy key."""
    from higgsfield.control.project.scaffold import ensure_deploy_key, read_public_key

    cfg = get_config(ctx)
    if generate:
        key = ensure_deploy_key(cfg.name)
        if key.created:
            click.echo(f"created {key.private_path}", err=True)
        click.echo(key.public_key)
        return
    click.echo(read_public_key(cfg.name))

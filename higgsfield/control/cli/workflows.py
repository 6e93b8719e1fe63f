"""``higgsfield build-experiments`` and ``higgsfield experiments``: the experiments under src/ and their workflows."""

from __future__ import annotations

import json
from pathlib import Path

import click

from higgsfield.contract.errors import HiggsfieldError
from higgsfield.control.cli._common import get_config


@click.command("build-experiments")
@click.option("--src", "src_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the experiments are (default: src/ next to higgsfield.yml).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the workflows go (default: .github/workflows/ next to higgsfield.yml).")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when the workflows are not up to date.")
@click.pass_context
def build_experiments(ctx: click.Context, src_dir: Path | None, out_dir: Path | None, check: bool) -> None:
    """Render .github/workflows/: deploy.yml, run_<experiment>.yml per experiment, kill.yml.

    Files this command generated before and no longer renders are removed; workflows
    you wrote yourself (no DO-NOT-EDIT header) are never touched.
    """
    from higgsfield.control.workflows import build_workflows

    cfg = get_config(ctx)
    result = build_workflows(cfg, src_dir=src_dir, out_dir=out_dir, check=check)
    where = _shown(result.out_dir, cfg.project_dir)
    verb = ("would write", "would remove") if check else ("wrote", "removed")
    for name in result.written:
        click.echo(f"{verb[0]} {where}/{name}")
    for name in result.removed:
        click.echo(f"{verb[1]} {where}/{name}")
    count = len(result.experiments)
    tail = f"{count} experiment{'s' if count != 1 else ''}: {', '.join(result.experiments) or 'none under src/'}"
    if check and result.changed:
        raise HiggsfieldError(f"{where} is not up to date ({tail}); run 'higgsfield build-experiments' and commit")
    state = "changed" if result.changed else "up to date"
    click.echo(f"{where}: {state} ({tail})")


@click.command("experiments")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (name, file, params) instead of a table.")
@click.option("--src", "src_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the experiments are (default: src/ next to higgsfield.yml).")
@click.pass_context
def experiments(ctx: click.Context, as_json: bool, src_dir: Path | None) -> None:
    """List the experiments found under src/ with their params."""
    from higgsfield.contract.codec import encode
    from higgsfield.control.project.discovery import discover

    root = get_config(ctx).project_dir
    found = discover(src_dir or root / "src")
    if as_json:
        click.echo(json.dumps({"experiments": [encode(e.as_json()) for e in found]}, indent=2))
        return
    if not found:
        click.echo("no experiments under src/ (decorate a function with @experiment(\"name\"))")
        return
    from higgsfield.contract.text import one_line, shown

    for exp in found:
        click.echo(f"{exp.name}  ({one_line(_shown(exp.file, root))}:{exp.line})")
        for p in exp.params:
            # Source text, shown on a terminal: escapes and line breaks printed as text, never obeyed.
            value = "required" if p.required else f"default {shown(p.default)}"
            opts = f", one of {shown(list(p.options))}" if p.options is not None else ""
            desc = f"  {one_line(p.description, 200)}" if p.description else ""
            click.echo(f"    {p.name}: {p.type}, {value}{opts}{desc}")


def _shown(path: Path, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)

"""``higgsfield prune``: free node disk, as a thin renderer over :mod:`higgsfield.control.backends.nodes.prune`."""

from __future__ import annotations

from typing import Any

import click

from higgsfield.control.cli._common import get_config


def _older_than(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """``--older-than 30d``: the grammar of ``logs --since`` and ``retention.max_age`` (seconds)."""
    from higgsfield.contract.text import shown
    from higgsfield.contract.units import FORMS, duration_s

    if value is None:
        return None
    secs = duration_s(value)
    if secs is None:
        raise click.BadParameter(f"{shown(value)} is not a duration: use {FORMS}")
    return secs


def _run_names(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    from higgsfield.control.cli._common import run_name

    return tuple(str(run_name(ctx, param, v)) for v in value)


@click.command()
@click.option("--dry-run", is_flag=True, help="Only list what would be removed (exactly what a real prune removes).")
@click.option("--older-than", callback=_older_than, metavar="AGE",
              help="Finished runs that ended more than AGE ago: 30s, 10m, 2h, 30d.")
@click.option("--run", "runs", multiple=True, callback=_run_names, metavar="RUN",
              help="Exactly this finished run (repeatable).")
@click.option("--images", is_flag=True, help="Also the project's images that no release and no active run uses.")
@click.option("--checkpoints", is_flag=True, help="Also the removed runs' checkpoints (never without this "
                                                  "or retention.checkpoints).")
@click.pass_context
def prune(ctx: click.Context, dry_run: bool, older_than: float | None, runs: tuple[str, ...], images: bool,
          checkpoints: bool) -> None:
    """Free space on every node: remove finished runs' directories and logs, their checkpoints when asked,
    and images no release uses.

    \b
    A queued, starting or running run is never touched, nor the current release's image.
    Without --older-than, --run or --images: what retention: in higgsfield.yml says.
    On a Slurm cluster: the runs in the login node's workdir.
    """
    from higgsfield.contract.errors import GroupError
    from higgsfield.control.backends.nodes.prune import policy_for
    from higgsfield.control.backends.nodes.prune import prune as _prune

    cfg = get_config(ctx)
    if cfg.slurm is not None:  # a Slurm cluster: its runs live in the login node's workdir
        cfg = cfg.on_login_node()
    policy = policy_for(cfg, older_than_s=older_than, runs=runs, images=images, checkpoints=checkpoints,
                        dry_run=dry_run)
    result = _prune(cfg, policy)
    _render_prune(result)
    if result.failed:
        raise GroupError(f"prune failed on {len(result.failed)} node(s): "
                         + "; ".join(f"{n}: {why}" for n, why in result.failed), result)


def _render_prune(result: Any) -> None:
    """Per node: each run, checkpoint dir and image removed (or that would be), what stayed and why."""
    from higgsfield.contract.text import inert
    from higgsfield.contract.units import human_bytes

    verb = "would remove" if result.dry_run else "removed"
    for n in result.nodes:
        node = inert(n.node)
        click.echo(f"{node}: {verb} {len(n.runs)} run(s), {len(n.checkpoints)} checkpoint dir(s), "
                   f"{len(n.images)} image(s): {human_bytes(n.freed_bytes)}")
        for r in n.runs:
            click.echo(f"  run {inert(r.run)} ({inert(r.state)}) {human_bytes(r.bytes)}")
        for c in n.checkpoints:
            click.echo(f"  checkpoints {inert(c.path)} {human_bytes(c.bytes)}")
        for i in n.images:
            click.echo(f"  image {inert(i.tag)} {human_bytes(i.bytes)}")
        for k in n.kept:
            what = f"run {k.run}" if k.run is not None else f"image {k.image}"
            click.echo(f"  kept {inert(what)}: {inert(k.why)}")
        for line in n.skipped:
            click.echo(f"  skipped {inert(line)}")
        for line in n.notes:
            click.echo(f"  {inert(line)}")
    freed = human_bytes(result.freed_bytes)
    click.echo(f"{'dry run: would free' if result.dry_run else 'freed'} {freed} on {len(result.nodes)} node(s)")

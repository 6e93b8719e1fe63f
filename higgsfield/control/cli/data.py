"""``higgsfield data push``: a thin renderer over :mod:`higgsfield.control.backends.nodes.data.push`."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from higgsfield.control.cli._common import get_config


@click.group()
def data() -> None:
    """Data and weights on every node: the data: entries of higgsfield.yml."""


@data.command()
@click.argument("names", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (no live view).")
@click.pass_context
def push(ctx: click.Context, names: tuple[str, ...], as_json: bool) -> None:
    """Send the data: entries NAMES (default: all) to every node; an unchanged one sends nothing.

    \b
    The laptop sends each byte once, to the first node; the nodes copy among themselves.
    A URL or Hub source is downloaded by the first node. Each node makes a new version
    current at once (a run sees the old or the whole new one); a cut push resumes.
    """
    from rich.console import Console

    from higgsfield.control import secrets
    from higgsfield.control.backends.nodes.data.push import push as _push

    cfg = get_config(ctx)
    if cfg.slurm is not None:   # the login node's workdir, which the compute nodes share: once
        cfg = cfg.on_login_node()
    values = secrets.collect(cfg)
    out = Console(stderr=True)
    live = None
    if out.is_terminal and not as_json:
        from rich.live import Live

        live = Live(_table([]), console=out, transient=True, refresh_per_second=8)

    last = [0.0]

    def on_progress(nodes: list[Any]) -> None:
        if live is not None:
            live.update(_table(nodes))
        elif not as_json and time.monotonic() - last[0] > 2:
            last[0] = time.monotonic()
            for n in nodes:
                if n.state not in ("done", "up to date", "checking", "waiting"):
                    click.echo(_line(n), err=True)

    if live is not None:
        with live:
            result = _push(cfg, names, secrets=values, on_progress=on_progress)
    else:
        result = _push(cfg, names, secrets=values, on_progress=on_progress)
    if as_json:
        from higgsfield.contract.codec import encode
        from higgsfield.control.backends.nodes.data.push import report

        click.echo(json.dumps(encode(report(result)), sort_keys=True))
        return
    from higgsfield.contract.text import inert
    from higgsfield.contract.units import human_bytes

    for e in result.entries:
        click.echo(f"{inert(e.name)}: version {e.version}, {e.files} file(s), {human_bytes(e.bytes)} "
                   f"from {inert(e.source)}")
    for n in result.nodes:
        click.echo(f"  {_line(n)}")
    click.echo(f"sent {human_bytes(result.uplink_bytes)} from here in {result.seconds:.1f}s")


def _line(n: Any) -> str:
    from higgsfield.contract.text import inert
    from higgsfield.contract.units import human_bytes

    via = f" from {n.via}" if n.via else ""
    eta = f", ETA {n.eta:.0f}s" if n.eta is not None else ""
    rate = f", {human_bytes(int(n.rate))}/s" if n.rate else ""
    return f"{inert(n.node)}: {n.state}, {human_bytes(n.done)} of {human_bytes(n.total)}{via}{rate}{eta}"


def _table(nodes: list[Any]) -> Any:
    from rich.table import Table

    from higgsfield.contract.units import human_bytes

    t = Table(box=None)
    for col in ("node", "state", "bytes", "rate", "ETA"):
        t.add_column(col)
    for n in nodes:
        t.add_row(n.node, n.state, f"{human_bytes(n.done)} / {human_bytes(n.total)}",
                  f"{human_bytes(int(n.rate))}/s" if n.rate else "", f"{n.eta:.0f}s" if n.eta is not None else "")
    return t


@data.command()
@click.option("--json", "as_json", is_flag=True, help="Print (node, entry, version) rows and the differences as JSON.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Each data: entry's version on every node; a node that differs is named (exit 1)."""
    from higgsfield.control.backends.nodes.data.check import data_versions

    cfg = get_config(ctx)
    if cfg.slurm is not None:
        cfg = cfg.on_login_node()
    held, diffs = data_versions(cfg)
    if as_json:
        click.echo(json.dumps({"versions": [{"node": n, "entry": e, "version": v} for n, e, v in held],
                               "differ": diffs}, sort_keys=True))
    else:
        render_versions(held, diffs)
    if diffs:
        ctx.exit(1)


def render_versions(held: list[tuple[str, str, str | None]], diffs: list[str]) -> None:
    """The rows as doctor and ``data status`` show them."""
    from higgsfield.contract.text import inert

    for node, entry, version in held:
        click.echo(f"  data {inert(entry)} on {inert(node)}: {version or 'missing'}")
    for line in diffs:
        click.echo(f"  {inert(line)}")


@data.command()
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@click.pass_context
def prune(ctx: click.Context, dry_run: bool) -> None:
    """Remove every data version that is not current on each node, and the files no version uses."""
    import asyncio

    from higgsfield.contract.data import PruneDataReply
    from higgsfield.contract.text import inert
    from higgsfield.contract.units import human_bytes
    from higgsfield.control.backends.nodes.output import invoke_reply
    from higgsfield.control.remote import Group, open_group

    cfg = get_config(ctx)
    if cfg.slurm is not None:
        cfg = cfg.on_login_node()

    async def go() -> list[Any]:
        async with open_group(cfg) as group:
            return Group.check(await group.run(lambda m: invoke_reply(
                m.transport, cfg, ["data", "prune", "--project", cfg.name] + (["--dry-run"] if dry_run else []),
                PruneDataReply)), "data prune")

    for r in asyncio.run(go()):
        verb = "would remove" if dry_run else "removed"
        click.echo(f"{inert(r.node)}: {verb} {len(r.value.removed)} version(s), {r.value.objects} file(s), "
                   f"{human_bytes(r.value.freed_bytes)}")
        for v in r.value.removed:
            click.echo(f"  {inert(v)}")

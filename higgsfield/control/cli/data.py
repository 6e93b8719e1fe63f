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

"""``higgsfield ui`` (the live dashboard) and ``higgsfield metrics RUN`` (the same curves in the terminal).

Thin: :mod:`higgsfield.control.ui.server` serves; the metrics are the backend Session's
(``Session.metrics``: an SSH run's node 0, a Slurm run's workdir through the login node).
Neither starlette nor uvicorn is imported before ``ui`` runs.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any

import click

from higgsfield.control.cli._common import console, get_config, run_name

if TYPE_CHECKING:
    from higgsfield.control.config import Config
    from higgsfield.control.ui.server import Address
    from higgsfield.metrics import StepMetrics


@click.command()
@click.option("--port", type=int, default=8765, show_default=True, help="TCP port (0: a free one).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback exposes the dashboard (token-protected) "
                   "to your network.")
@click.option("--no-browser", is_flag=True, help="Print the URL only; do not open a browser.")
@click.pass_context
def ui(ctx: click.Context, port: int, host: str, no_browser: bool) -> None:
    """Serve the live dashboard of this project's runs, queue, nodes, logs and curves.

    The URL carries a secret token (like Jupyter's); share it only with people who
    may stop and start your runs.
    """
    from higgsfield.control.ui.server import is_loopback, serve

    cfg = get_config(ctx)
    err = console(stderr=True)
    if not is_loopback(host):
        err.print(f"[yellow]warning:[/] listening on {host}: anyone who can reach this address and has the "
                  "token in the URL can kill and start runs; the traffic is not encrypted (use an SSH tunnel "
                  "to 127.0.0.1 instead where you can)", highlight=False)

    def ready(address: Address) -> None:
        where = "its Slurm cluster, through the login node" if cfg.slurm is not None else f"{len(cfg.nodes)} node(s)"
        err.print(f"[bold]higgsfield ui[/] for {cfg.name} ({where}); Ctrl-C stops it", highlight=False)
        click.echo(address.url)
        sys.stdout.flush()
        if not no_browser:
            import webbrowser

            webbrowser.open(address.url)

    try:
        serve(cfg, host=host, port=port, on_ready=ready)
    except KeyboardInterrupt:
        pass


@click.command()
@click.argument("target", metavar="EXPERIMENT|RUN", callback=run_name)
@click.option("--json", "as_json", is_flag=True,
              help='One JSON object per step (StepMetrics), one per line; when lines of the metrics file were '
                   'not a step\'s metrics, a last line {"skipped": N} (with -f: the total so far, when it grows).')
@click.option("--follow", "-f", is_flag=True, help="Keep printing steps until the run ends.")
@click.pass_context
def metrics(ctx: click.Context, target: str, as_json: bool, follow: bool) -> None:
    """Print a run's step metrics: loss, tokens/s, learning rate, MFU and memory (what the dashboard plots).

    Lines of the run's metrics file that are not a step's metrics are left out and counted
    ("3 lines skipped", on stderr).
    """
    cfg = get_config(ctx)
    try:
        asyncio.run(_metrics(cfg, target, as_json=as_json, follow=follow))
    except KeyboardInterrupt:
        sys.exit(130)


async def _metrics(cfg: Config, target: str, *, as_json: bool, follow: bool) -> None:
    from higgsfield.control.backends import backend_for
    from higgsfield.metrics import Skipped, latest_per_step

    async with backend_for(cfg).session() as session:
        status = await session.find(target)
        got: list[StepMetrics] = []
        skipped = Skipped(0)
        async for m in session.metrics(status, follow=follow):
            if m is None:
                continue
            if isinstance(m, Skipped):
                skipped = m
                if follow and as_json:
                    click.echo(json.dumps({"skipped": m.count}))
                continue
            if follow:
                _show([m], as_json=as_json, header=not got)
            got.append(m)
        if not follow:
            _show(latest_per_step(got), as_json=as_json, header=True)
            if as_json and skipped.count:
                click.echo(json.dumps({"skipped": skipped.count}))
        if skipped.count:
            click.echo(f"run {status.run}: {skipped}", err=True)
        if not got and not as_json:
            click.echo(f"run {status.run} has no step metrics yet (rank 0 writes them with "
                       "higgsfield.training.StepTimer)", err=True)


def _show(steps: list[StepMetrics], *, as_json: bool, header: bool) -> None:
    if as_json:
        for m in steps:
            click.echo(m.to_json())
        return
    if header and steps:
        click.echo(f"{'STEP':>7}  {'LOSS':>10}  {'TOKENS/S':>10}  {'LR':>9}  {'MFU':>6}  {'MEM GiB':>7}")
    for m in steps:
        click.echo(f"{m.step:>7}  {_num(m.loss, '.4f'):>10}  {_num(m.tokens_per_s, ',.0f'):>10}  "
                   f"{_num(m.lr, '.2e'):>9}  {_num(None if m.mfu is None else 100 * m.mfu, '.1f'):>6}  "
                   f"{_num(m.peak_memory_gib, '.1f'):>7}")


def _num(v: Any, fmt: str) -> str:
    if v is None or v != v:   # None or NaN
        return "-"
    return format(v, fmt)


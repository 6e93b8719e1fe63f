"""What the CLI prints of what nodes send: node text made inert, log lines tagged ``node/rank``, ``--since``.

Shared by ``run`` (which follows its run's logs), ``logs`` and ``stacks``; every byte a
node sends goes through :func:`clean` before a terminal sees it.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING

import click

from higgsfield.contract.text import inert, shown
from higgsfield.contract.units import duration_s

if TYPE_CHECKING:
    from higgsfield.control.backends.nodes import LogLine


def clean(text: str) -> str:
    """``text`` with its control characters shown inert (tab kept): what a node sends is shown, never obeyed.

    Always, not only on a terminal: ``logs > file`` then ``cat file`` reaches one too, and
    the node's ``rank<N>.log`` keeps the exact bytes for whoever needs them (``--json`` output
    is JSON, escaped by its encoder). See :func:`higgsfield.contract.text.inert`.
    """
    return inert(text)


def printer(*, color: bool) -> Callable[[LogLine], None]:
    """Prints one log line to stdout, tagged ``node/rank`` (what a node sent is shown, never obeyed)."""
    from higgsfield.control.backends.nodes import NOTICE

    out = sys.stdout

    def show(line: LogLine) -> None:
        who = "higgsfield" if line.rank == NOTICE else "launcher" if line.rank < 0 else line.rank
        tag = clean(f"{line.node}/{who}")
        text = clean(line.text)
        if color:
            code = 36 if line.rank < 0 else 31 + (line.rank % 6)
            out.write(f"\x1b[{code}m{tag}\x1b[0m | {text}\n")
        else:
            out.write(f"{tag} | {text}\n")
        out.flush()

    return show


def print_lines(lines: Iterable[LogLine], *, color: bool) -> None:
    """Print ``lines`` (already fetched), tagged ``node/rank``."""
    show = printer(color=color)
    for line in lines:
        show(line)


async def print_stream(lines: AsyncIterator[LogLine], *, color: bool) -> None:
    """Print ``lines`` as they come; the streams behind them close however this ends."""
    show = printer(color=color)
    async with contextlib.aclosing(lines) as items:  # type: ignore[type-var]
        async for line in items:
            show(line)


def parse_since(value: str, now: float | None = None) -> float:
    """``--since``: ``30s``/``10m``/``2h``/``1d`` ago, or an ISO time (local unless it names a zone) -> UNIX time."""
    text = value.strip()
    secs = duration_s(text)
    if secs is not None:
        ago = (time.time() if now is None else now) - secs
        return ago if ago > 0 else 0.0   # "99999d" (or 1e400 s: -inf) means since the start
    try:
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise click.BadParameter(f"{shown(value)} is neither a duration ago (30s, 10m, 2h, 1d) "
                                 "nor a time (2026-11-30T10:00, local time)") from None
    try:
        return max(when.timestamp(), 0.0)  # a naive time is local time
    except (ValueError, OverflowError, OSError):
        # The platform cannot place it (0001-01-01): long before any log line, so every line.
        return 0.0


def since_option(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """The ``--since`` option's callback: :func:`parse_since`, or None when not given."""
    return None if value is None else parse_since(value)

"""Durations as people type them (``30s``, ``10m``, ``2h``, ``30d``) and sizes as they read them (``1.5 GiB``).

One grammar for every option and field that takes a duration (``logs --since``,
``prune --older-than``, ``retention.max_age``), so "30d" means the same everywhere, and
one way to show bytes (``prune``, ``doctor``). Stdlib only: the config model, the
control side and the CLI all read it.

Use::

    duration_s("30d")    # 2592000.0
    duration_s("soon")   # None: not a duration
    human_bytes(1536)    # '1.5 KiB'
"""

from __future__ import annotations

import re

DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
FORMS = "30s, 10m, 2h, 30d"


def duration_s(text: str) -> float | None:
    """``text`` in seconds, or None when it is not a duration (a number and one of s, m, h, d)."""
    m = DURATION_RE.fullmatch(text.strip().lower())
    return None if m is None else float(m.group(1)) * UNIT_S[m.group(2)]


def human_bytes(n: int) -> str:
    """``n`` bytes in binary units: ``512 B``, ``1.5 KiB``, ``12.0 GiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"

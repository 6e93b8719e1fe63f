"""User-given text in messages: quoted, cut to a sane length, on one line.

An error that quotes what the user typed must stay one readable line, whatever was
typed: a 10 MB value, a newline, a terminal escape. :func:`shown` is the one way a
value enters a message::

    raise ConfigError(f"{path}: name {shown(value)} is not valid")   # name 'abc…' (10000001 chars)

:func:`one_line` is the CLI's last guard on a whole message.
"""

from __future__ import annotations

import re
from typing import Any

#: Characters of a value quoted in a message; longer values are cut with "…".
LIMIT = 60
#: Characters of a whole one-line message before the CLI cuts it.
MESSAGE_LIMIT = 2000
# C0 (tab too), DEL, C1, the Unicode line/paragraph separators, and lone surrogates (which no
# UTF-8 file holds, but a YAML "\\udcff" escape makes, and which no terminal can print): never shown raw.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def shown(value: Any, limit: int = LIMIT) -> str:
    """``repr(value)`` for a message, cut to about ``limit`` characters, saying its length when cut.

    ``repr`` escapes newlines and control characters, so the result is one line. Only
    the head of a long string or list is ever formatted, so quoting a 10 MB value costs
    nothing.
    """
    text = _short(value, limit, depth=0)
    return text if len(text) <= limit * 2 else text[:limit * 2] + "…"


def _short(value: Any, limit: int, depth: int) -> str:
    if isinstance(value, str) and len(value) > limit:
        head = repr(value[:limit])
        return f"{head[:-1]}…{head[-1]} ({len(value)} chars)"
    if isinstance(value, (bytes, bytearray)) and len(value) > limit:
        return f"{bytes(value[:limit])!r}… ({len(value)} bytes)"
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        if depth >= 3:
            return f"<{type(value).__name__}>"
        items = list(value.items() if isinstance(value, dict) else value)
        parts = []
        for item in items[:8]:
            if isinstance(item, tuple) and isinstance(value, dict):
                parts.append(f"{_short(item[0], limit, depth + 1)}: {_short(item[1], limit, depth + 1)}")
            else:
                parts.append(_short(item, limit, depth + 1))
        if len(items) > 8:
            parts.append(f"… ({len(items)} items)")
        brackets = {"list": "[]", "tuple": "()", "dict": "{}"}.get(type(value).__name__, "{}")
        return brackets[0] + ", ".join(parts) + brackets[1]
    if isinstance(value, int) and value.bit_length() > 4 * limit:
        return f"<an integer of {value.bit_length()} bits>"   # repr() refuses past 4300 digits anyway
    return repr(value)


def has_control(text: str) -> bool:
    """True when ``text`` holds a control character (tab, newline, escape, NUL, DEL, C1, U+2028/9, a surrogate)."""
    return _CONTROL.search(text) is not None


def one_line(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """``message`` with every control character escaped and cut to ``limit``: what the CLI prints."""
    out = _CONTROL.sub(lambda m: repr(m.group())[1:-1], message)
    if len(out) > limit:
        out = out[:limit] + f"… ({len(out) - limit} more chars)"
    return out

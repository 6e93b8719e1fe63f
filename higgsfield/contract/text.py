"""User-given text in messages: quoted, cut to a sane length, on one line.

An error that quotes what the user typed must stay one readable line, whatever was
typed: a 10 MB value, a newline, a terminal escape. :func:`shown` is the one way a
value enters a message::

    raise ConfigError(f"{path}: name {shown(value)} is not valid")   # name 'abc…' (10000001 chars)

:func:`one_line` is the CLI's last guard on a whole message.

What a node or a run sends back is text too: :func:`inert` makes it safe on a terminal
(control bytes shown, never obeyed) and :class:`LineSplitter` reads it as lines of
bounded length, cut with a visible marker.
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


# -- what a node or a run sends back: shown, never obeyed --------------------------------------------

#: Bytes of one output line kept; the rest is cut with :func:`cut_marker` (journald's LineMax is 48 KiB).
MAX_LINE = 64 * 1024
# C0 but tab, DEL, C1: what a terminal obeys (ESC sequences, OSC titles, BEL, CR, backspace), and lone
# surrogates (a name read from JSON can hold one; no terminal can print it).
_TERMINAL_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\ud800-\udfff]")


def _picture(m: re.Match[str]) -> str:
    c = ord(m.group())
    if c < 0x20:
        return chr(0x2400 + c)          # Unicode's control pictures: ESC -> ␛, BEL -> ␇, CR -> ␍, NUL -> ␀
    if c == 0x7F:
        return "\u2421"                 # ␡
    if c <= 0x9F:
        return f"\\x{c:02x}"            # C1 has no pictures: a visible escape
    return "\ufffd"                     # a lone surrogate


def inert(text: str) -> str:
    """``text`` safe to print on a terminal: every control character but tab shown as a visible symbol.

    What a rank prints or a node's disk holds reaches the user's terminal through this, so
    an ESC, an OSC title, a BEL, a CR or a backspace is seen, never obeyed; tab stays (log
    tables use it). The symbols are visible and one column wide (``"\\x1b[31m"`` ->
    ``"␛[31m"``), so a reader can tell what was there, which dropping them hid::

        print(inert(line.text))
    """
    return _TERMINAL_CONTROL.sub(_picture, text) if _TERMINAL_CONTROL.search(text) else text


def cut_marker(dropped: int) -> str:
    """What ends a line cut at :data:`MAX_LINE`: how many bytes of it are not shown."""
    return f" … [cut {dropped} bytes]"


class LineSplitter:
    """Splits a byte stream into lines of text, keeping at most ``max_line`` bytes of each.

    A longer line is cut (at a UTF-8 character boundary) and ends with :func:`cut_marker`;
    every later line still comes. Memory stays at ``max_line`` per stream whatever arrives,
    even gigabytes without a newline. Bytes are decoded with U+FFFD for invalid UTF-8; NUL
    and every other byte but the newline stay in the line. Why cut rather than split into
    continuation lines (as Kubernetes does at 16 KiB): a 10 MiB tensor dump is unreadable on a
    terminal either way, its whole text is still in the node's ``rank<N>.log``, and one line
    in stays one line out, which is what re-attaching a log stream counts::

        s = LineSplitter()
        for chunk in chunks:
            for line in s.feed(chunk): ...
        for line in s.end(): ...        # the last line, if it had no newline
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._head = bytearray()   # the kept start of the current line
        self._dropped = 0          # bytes of the current line past max_line

    def feed(self, data: bytes) -> list[str]:
        """The lines that ``data`` completes (each without its newline)."""
        *whole, rest = data.split(b"\n")   # one C-speed split: a busy log has thousands of lines a chunk
        if not whole:
            self._keep(rest)
            return []
        self._keep(whole[0])
        out = [self._take()]
        limit = self.max_line
        for line in whole[1:]:
            out.append(line.decode(errors="replace") if len(line) <= limit else self._cut(line))
        self._keep(rest)
        return out

    def end(self) -> list[str]:
        """The last line, when the stream ended without a newline after it (else nothing)."""
        return [self._take()] if self._head or self._dropped else []

    @property
    def pending(self) -> bool:
        """True when a line has begun (bytes after the last newline)."""
        return bool(self._head or self._dropped)

    def _keep(self, piece: bytes) -> None:
        room = self.max_line - len(self._head)
        if len(piece) <= room:
            self._head += piece
        else:
            self._head += piece[:room]
            self._dropped += len(piece) - room

    def _take(self) -> str:
        head, dropped = bytes(self._head), self._dropped
        self._head.clear()
        self._dropped = 0
        return head.decode(errors="replace") if not dropped else self._cut(head, dropped)

    def _cut(self, line: bytes, dropped: int = 0) -> str:
        """``line`` (``dropped`` more bytes of it already gone) cut to ``max_line`` bytes, with the marker."""
        head = line[:self.max_line]
        keep = _char_boundary(head)
        return head[:keep].decode(errors="replace") + cut_marker(dropped + len(line) - keep)


def _char_boundary(data: bytes) -> int:
    """The length of ``data`` without a UTF-8 character cut off at its end (at most 3 bytes less)."""
    end = len(data)
    for back in range(1, min(4, end + 1)):
        b = data[end - back]
        if b & 0xC0 != 0x80:   # not a continuation byte: the start of the last character
            need = 2 if b >= 0xC0 and b < 0xE0 else 3 if 0xE0 <= b < 0xF0 else 4 if b >= 0xF0 else 1
            return end if back >= need else end - back
    return end

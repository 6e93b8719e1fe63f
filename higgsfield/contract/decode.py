"""Decoding what comes back from a disk or a node: once, at the seam, typed, bounded, never trusted.

A node's state directory holds files a crash, a full disk or another tool may have
cut short or replaced; an invoker's reply may come from another version. Whoever
reads one reads it here (bounded, never through a symlink) and decodes it with the one
codec (:func:`higgsfield.contract.codec.decode`), into a typed dataclass, and gets a
:class:`DecodeError` (one line: what is wrong, naming the field) or a value whose every
field has the type it says. A caller that lists many files skips the one that fails and says so
(:func:`skip_line`), as git skips a bad ref: one damaged file never hides the rest.

- :func:`read_json`: a JSON file under a root, never through a symlink, at most
  ``MAX_FILE_BYTES``;
- :func:`loads`: ``json.loads``, its error one line;
- :func:`tail`: an error's last lines, at most ``TAIL_LINES`` of ``LINE_CHARS``.

Stdlib only (and :mod:`higgsfield.contract.text`): the node side and the control side both use it.

Use::

    data = read_json(rd.record_path, root=state_dir)          # DecodeError: skip it, say why
    record = decode(RunRecord, data)                           # contract.codec
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from higgsfield.contract.text import one_line

MAX_FILE_BYTES = 1 << 20    # a record, a spec, the queue: far below this; a larger file is not one
TAIL_LINES = 50             # an error tail shown and passed on: its last this many lines
LINE_CHARS = 500            # each cut to this many characters


class DecodeError(ValueError):
    """A file or a reply that does not decode into its type; ``str()`` is the one-line reason."""


def kind(v: object) -> str:
    """The JSON name of ``v``'s type, for a message (``a list``, ``a string``)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def read_json(path: Path, *, root: Path | None = None, limit: int = MAX_FILE_BYTES) -> object:
    """The parsed JSON of ``path``: a regular file under ``root`` reached through no symlink, of at most
    ``limit`` bytes, UTF-8. ``OSError`` when it is absent (the caller's usual case); else DecodeError."""
    path = Path(path)
    if root is not None:
        _check_under(path, Path(root))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if os.path.islink(path):
            raise DecodeError("a symlink (not followed)") from None
        raise e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DecodeError("not a regular file")
        if st.st_size > limit:
            raise DecodeError(f"too big ({st.st_size} bytes; at most {limit})")
        raw = os.read(fd, limit + 1)
        if len(raw) > limit:
            raise DecodeError(f"too big (over {limit} bytes)")
    finally:
        os.close(fd)
    return loads(raw)


def loads(raw: bytes | str) -> object:
    """``json.loads``, its error one line: ``not JSON (line 1: Expecting value)``, ``not UTF-8``."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DecodeError(f"not UTF-8 (byte {e.start})") from None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise DecodeError(f"not JSON (line {e.lineno}: {e.msg})") from None
    except (ValueError, RecursionError) as e:  # nesting too deep, a number too long
        raise DecodeError(f"not JSON ({one_line(str(e) or type(e).__name__, 100)})") from None


def _check_under(path: Path, root: Path) -> None:
    """``path`` lies inside ``root`` (no ``..``) and no directory between them is a symlink."""
    if ".." in os.fspath(path).split("/"):
        raise DecodeError("a path with '..' in it")
    top, full = os.path.abspath(root).rstrip("/"), os.path.abspath(path)   # no '..': only '.' and '//' go
    if not full.startswith(top + "/"):
        raise DecodeError(f"outside {one_line(top, 200)}")
    parts = full[len(top) + 1:].split("/")
    d = top
    for p in parts[:-1]:
        d = f"{d}/{p}"
        mode = os.lstat(d).st_mode      # absent: OSError, as for the file itself
        if stat.S_ISLNK(mode):
            raise DecodeError(f"{one_line(p, 100)} is a symlink (not followed)")
        if not stat.S_ISDIR(mode):
            raise DecodeError(f"{one_line(p, 100)} is not a directory")


def is_plain_dir(path: Path) -> bool:
    """A directory, not a symlink to one (a listing never follows a link out of its root)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def skip_line(rel: str, reason: str) -> str:
    """``runs/p/x/run.json: not JSON (...)``: the one line a listing gives for a file it skipped (the
    name escaped: a directory's name is bytes someone else chose)."""
    return f"{one_line(rel, 300)}: {one_line(reason, 300)}"


# -- field decoders (a codec rule's ``decode``) -----------------------------------------------------

def tail(v: object) -> list[str]:
    """An error tail: its last ``TAIL_LINES`` lines, each at most ``LINE_CHARS`` (a string is one line)."""
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list):
        raise TypeError("a list of strings")
    lines = [x if isinstance(x, str) else json.dumps(x) if isinstance(x, (int, float, bool)) else None
             for x in v[-TAIL_LINES:]]
    if any(x is None for x in lines):
        raise TypeError("a list of strings")
    return [cut(x) for x in lines if x is not None]


def cut(line: str, limit: int = LINE_CHARS) -> str:
    """``line`` at most ``limit`` characters, the cut marked."""
    return line if len(line) <= limit else line[:limit] + f"… ({len(line) - limit} more chars)"

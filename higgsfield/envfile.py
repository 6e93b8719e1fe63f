"""Read the project's git-ignored ``env`` file of secrets (``KEY=VALUE`` lines).

The format is the common dotenv subset, so the file also works with ``set -a; . ./env``::

    # a comment
    WANDB_API_KEY=0123abcd
    export HF_TOKEN="hf_..."       # 'export ' is allowed; quotes are removed

Values are never printed: callers report only whether a name is set. A line that
is not ``KEY=VALUE`` is a ConfigError naming the file and line (not the value).

Use::

    values = read_env_file(cfg.env_file)      # {} when the file does not exist
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

from higgsfield.errors import ConfigError

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def read_env_file(path: Path) -> dict[str, str]:
    """The KEY -> VALUE pairs of ``path``; an absent file is empty (secrets may come from CI)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    return parse_env(text, path)


def parse_env(text: str, path: Path | str = "env") -> dict[str, str]:
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not _KEY_RE.match(key):
            raise ConfigError(f"{path}:{lineno}: expected KEY=VALUE (KEY: letters, digits and _)")
        if key in out:
            raise ConfigError(f"{path}:{lineno}: {key} is set twice")
        out[key] = _unquote(value.strip())
    return out


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    if " #" in value:  # an unquoted trailing comment
        value = value.split(" #", 1)[0].rstrip()
    return value


def is_private(path: Path) -> bool:
    """True when only the owner can read ``path`` (or it does not exist)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return True
    return not mode & (stat.S_IRWXG | stat.S_IRWXO)

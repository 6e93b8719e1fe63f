"""Secret values: from the project's git-ignored ``env`` file, or the process environment (CI).

Only names listed under ``secrets:`` (and ``notify: to:``) in higgsfield.yml are ever read, and values
are only handed to transports as stdin payloads, never put in argv or logs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from higgsfield.contract.errors import ConfigError
from higgsfield.contract.notify import Notify
from higgsfield.contract.text import shown
from higgsfield.control.config import Config, decode_text

_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: An env file holds a few secrets; anything bigger is the wrong file.
MAX_ENV_BYTES = 1024 * 1024


def load_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines; ``#`` comments and blank lines skipped; optional quotes removed.

    Lines end at ``\\n`` only (``str.splitlines`` would also split a value at U+2028 or
    a form feed). A file that is not UTF-8 text, a key that is not a variable name and a
    key set twice are refused, naming the line.
    """
    if not path.is_file():
        return {}
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_ENV_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_ENV_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_ENV_BYTES // 1024} KiB; an env file holds KEY=VALUE lines")
    text = decode_text(data, path, "KEY=VALUE")
    out: dict[str, str] = {}
    for n, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip("\r").strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{path}:{n}: expected KEY=VALUE")
        if not _KEY_RE.fullmatch(key):
            raise ConfigError(f"{path}:{n}: {shown(key)} is not a variable name: use letters, digits and _")
        if key in out:
            raise ConfigError(f"{path}:{n}: {key} is set twice; keep one line")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


def collect(cfg: Config, environ: Mapping[str, str] | None = None, *, required: bool = True) -> dict[str, str]:
    """Values of the declared secrets: the env file first, then the environment."""
    environ = os.environ if environ is None else environ
    from_file = load_env_file(cfg.env_file)
    values: dict[str, str] = {}
    missing = []
    for name in cfg.secrets:
        value = from_file.get(name) or environ.get(name)
        if value:
            values[name] = value
        else:
            missing.append(name)
    if missing and required:
        raise ConfigError(f"{cfg.env_file}: secret {', '.join(missing)} declared in higgsfield.yml is not set; "
                          f"add {missing[0]}=... to the env file (or the environment / GitHub secrets)")
    return values


def notify(cfg: Config, environ: Mapping[str, str] | None = None) -> Notify:
    """The run's ``notify:`` destinations with their values (secrets, from where :func:`collect` reads them).

    Kept apart from :func:`collect`'s: a destination goes to the run's supervisor alone, never into the
    training's environment. An unset one is one line naming it (exit 2), before any node starts.
    """
    if cfg.notify is None:
        return Notify()
    environ = os.environ if environ is None else environ
    from_file = load_env_file(cfg.env_file)
    urls, missing = [], []
    for name in cfg.notify.to:
        value = from_file.get(name) or environ.get(name)
        if value:
            urls.append(value)
        else:
            missing.append(name)
    if missing:
        raise ConfigError(f"{cfg.env_file}: notify destination {', '.join(missing)} named in higgsfield.yml is not "
                          f"set; add {missing[0]}=<apprise URL> to the env file (or the environment / GitHub "
                          "secrets)")
    return Notify(tuple(urls), tuple(cfg.notify.events))

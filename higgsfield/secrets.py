"""Secret values: from the project's git-ignored ``env`` file, or the process environment (CI).

Only names listed under ``secrets:`` in higgsfield.yml are ever read, and values
are only handed to transports as stdin payloads, never put in argv or logs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from higgsfield.config import Config
from higgsfield.errors import ConfigError


def load_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines; ``#`` comments and blank lines skipped; optional quotes removed."""
    if not path.is_file():
        return {}
    out: dict[str, str] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{path}:{n}: expected KEY=VALUE")
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

"""The last fabric test this laptop ran, kept in the project: what ``run`` reads to price a step's traffic.

The result itself lives on the nodes (node 0's log of the ``fabric-<time>`` run,
:mod:`higgsfield.control.backends.nodes.fleet_fabric`), but asking a node for it would put an
SSH round trip before every ``run``. So ``doctor --fabric`` and ``run --preflight`` also write
it here, ``.higgsfield/fabric-last.json`` (git-ignored, 0600, replaced whole), as the typed
:class:`~higgsfield.contract.fabric_last.LastFabric` the nodes answer with; ``run`` reads it
with no network at all. A missing or unreadable file is simply no figure.

Use::

    save(cfg, result)          # after a fabric test (best effort: a full disk does not fail the test)
    last = load(cfg)           # LastFabric or None
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from higgsfield.contract.codec import decode, encode
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.fabric import FabricResult
from higgsfield.contract.fabric_last import LastFabric
from higgsfield.control.config import Config

FILE = Path(".higgsfield") / "fabric-last.json"


def path_of(cfg: Config) -> Path:
    return cfg.project_dir / FILE


def save(cfg: Config, result: FabricResult, *, at: float | None = None) -> None:
    """Keep ``result`` as the project's last fabric figure; an OSError is swallowed (it is only a cache)."""
    path = path_of(cfg)
    last = LastFabric(run=result.run or None, at=time.time() if at is None else at, result=result)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(encode(last), f)
        os.replace(tmp, path)
    except OSError:
        return


def load(cfg: Config) -> LastFabric | None:
    """The last fabric test kept in the project, or None (none yet, or the file is unreadable)."""
    try:
        last = decode(LastFabric, json.loads(path_of(cfg).read_text(encoding="utf-8")))
    except (OSError, ValueError, DecodeError):
        return None
    return last if last.result is not None else None

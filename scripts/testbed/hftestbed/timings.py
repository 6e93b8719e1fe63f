"""How long each phase of ``up`` took: printed at the end and kept in ``timings.json``."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

from .base import log


class Timings:
    """Phase timings; printed at the end and kept in state/timings.json."""

    def __init__(self) -> None:
        self.phases: list[tuple[str, float, str]] = []
        self.t0 = time.monotonic()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[dict]:
        info: dict = {"note": ""}
        t0 = time.monotonic()
        log(f"phase {name} ...")
        try:
            yield info
        finally:
            dt = time.monotonic() - t0
            self.phases.append((name, dt, info["note"]))
            log(f"phase {name}: {dt:.1f}s {info['note']}".rstrip())

    def report(self) -> str:
        lines = [f"  {name:<16} {dt:7.1f}s  {note}".rstrip() for name, dt, note in self.phases]
        lines.append(f"  {'total (wall)':<16} {time.monotonic() - self.t0:7.1f}s")
        return "\n".join(lines)

    def save(self, sdir: Path) -> None:
        data = {"at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "phases": [{"name": n, "seconds": round(dt, 2), "note": note}
                           for n, dt, note in self.phases]}
        with contextlib.suppress(OSError):
            (sdir / "timings.json").write_text(json.dumps(data, indent=2) + "\n")

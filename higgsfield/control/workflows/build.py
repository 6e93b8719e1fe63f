"""Write the rendered workflows into ``.github/workflows/``: deterministic, stale files removed, user files spared.

A file is ours when its first line is :data:`~higgsfield.control.workflows.render.HEADER_MARKER`.
Ours are rewritten only when their text changes (so a second build changes no byte)
and removed when nothing renders them any more (an experiment was renamed or
deleted). A file without the marker is the user's: never rewritten, never removed,
and a name clash with it is an error rather than an overwrite.

Use::

    result = build_workflows(cfg)               # src/ -> .github/workflows/
    result = build_workflows(cfg, check=True)   # writes nothing; result.changed says what would change
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from higgsfield.contract.errors import HiggsfieldError
from higgsfield.control.project.discovery import discover
from higgsfield.control.workflows.render import HEADER_MARKER, render_workflows

if TYPE_CHECKING:
    from higgsfield.control.config import Config

WORKFLOWS_DIR = Path(".github") / "workflows"
_SUFFIXES = (".yml", ".yaml")


@dataclass
class BuildResult:
    """What a build did (or, with ``check=True``, would do), as file names in ``out_dir``."""

    out_dir: Path
    written: list[str] = field(default_factory=list)     # new or changed
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)     # generated before, not any more
    experiments: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.written or self.removed)


def is_generated(path: Path) -> bool:
    """True when ``path`` starts with the DO-NOT-EDIT header, i.e. this command wrote it."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().startswith(HEADER_MARKER)
    except OSError:
        return False


def build_workflows(cfg: Config, src_dir: Path | None = None, out_dir: Path | None = None,
                    check: bool = False) -> BuildResult:
    """Render every workflow for the experiments under ``src_dir`` into ``out_dir``."""
    src_dir = Path(src_dir) if src_dir else cfg.project_dir / "src"
    out_dir = Path(out_dir) if out_dir else cfg.project_dir / WORKFLOWS_DIR
    experiments = discover(src_dir)
    files = render_workflows(cfg, experiments)
    result = BuildResult(out_dir=out_dir, experiments=[e.name for e in experiments])
    if out_dir.exists() and not out_dir.is_dir():
        raise HiggsfieldError(f"{out_dir} is not a directory: the workflows go there; move it away")
    try:
        _apply(files, out_dir, result, check)
    except OSError as e:
        raise HiggsfieldError(f"cannot write the workflows in {out_dir}: {e.strerror or e}") from None
    return result


def _apply(files: dict[str, str], out_dir: Path, result: BuildResult, check: bool) -> None:
    """Compare, remove stale files and write new ones; every check that can refuse runs before any write."""
    for name in files:
        path = out_dir / name
        if path.exists() and not is_generated(path):
            raise HiggsfieldError(f"{path}: a workflow that higgsfield did not generate has this name; "
                                  "rename or remove it, then run 'higgsfield build-experiments' again")
    if out_dir.is_dir():
        for path in sorted(out_dir.iterdir()):
            if path.suffix in _SUFFIXES and path.name not in files and path.is_file() and is_generated(path):
                result.removed.append(path.name)
                if not check:
                    path.unlink()
    for name, text in files.items():
        path = out_dir / name
        if path.is_file() and path.read_bytes() == text.encode("utf-8"):
            result.unchanged.append(name)
            continue
        result.written.append(name)
        if not check:
            _write(path, text)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

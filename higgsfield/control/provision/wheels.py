"""The invoker's wheel and its dependency wheelhouse, built on the control side and cached.

Nodes may have no package index, so ``setup`` sends everything over SFTP:

- :func:`build_wheel`: this package at exactly the control side's version. From a
  source checkout it is built with ``pip wheel`` (in a temporary copy, so the checkout
  gets no ``build/``); from a normal install it is repacked from the installed files.
  Cached as ``<cache>/invoker/higgsfield-<build id>.whl``.
- :func:`build_wheelhouse`: binary wheels of the runtime dependencies for the node's
  Python and platform (``pip download --only-binary :all: --platform ...``): the
  wheel's own ``Requires-Dist``, pinned to the versions installed here so nodes match
  the control side. Cached per (Python, machine, glibc) under ``<cache>/wheelhouse/``. Returns
  ``None`` when the control side cannot download them (then the node's own index is used).

The build id is ``<version>+<hash of the sources>``, so a changed checkout reinstalls
the invoker even when the version string did not change.
"""

from __future__ import annotations

import asyncio
import base64
import csv
import email.parser
import hashlib
import importlib.metadata as md
import io
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import higgsfield
from higgsfield.contract.codec import rule
from higgsfield.contract.errors import WheelError
from higgsfield.contract.text import shown

DIST = "higgsfield"
_SOURCE_ITEMS = ("pyproject.toml", "setup.py", "setup.cfg", "MANIFEST.in", "README.md", "LICENSE",
                 "higgsfield", "templates")


def _major_minor(v: str) -> None:
    if not re.fullmatch(r"\d+\.\d+", v):
        raise ValueError(f"{shown(v)} is not MAJOR.MINOR")


@dataclass(frozen=True)
class NodePython:
    """The node's interpreter, as far as wheel selection cares (the invoker step's probe answers it as JSON)."""

    WHAT: ClassVar[str] = "answer"

    version: str = field(metadata=rule(check=_major_minor))  # "3.11"
    machine: str  # "x86_64"
    glibc: str | None  # "2.36"

    @property
    def tag(self) -> str:
        return f"cp{self.version.replace('.', '')}-{self.machine}-glibc{self.glibc or 'none'}"


def source_root() -> Path | None:
    """The checkout this package runs from (a pyproject.toml naming it), or None when installed."""
    root = Path(higgsfield.__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and re.search(r'(?m)^name\s*=\s*"higgsfield"', pyproject.read_text()):
        return root
    return None


def _source_files(root: Path) -> list[Path]:
    files: list[Path] = []
    for item in _SOURCE_ITEMS:
        p = root / item
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            files += [f for f in sorted(p.rglob("*"))
                      if f.is_file() and "__pycache__" not in f.parts and f.suffix not in (".pyc", ".pyo")]
    return files


def build_id() -> str:
    """``<version>+<12 hex>``: the version plus a hash of what the wheel is made of."""
    h = hashlib.sha256()
    root = source_root()
    if root is not None:
        for f in _source_files(root):
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    else:
        dist = md.distribution(DIST)
        h.update((dist.read_text("RECORD") or "").encode())
    return f"{higgsfield.__version__}+{h.hexdigest()[:12]}"


def build_wheel(cache_dir: Path) -> Path:
    """The invoker wheel for this exact build (built once, then taken from the cache)."""
    out_dir = cache_dir / "invoker"
    bid = build_id()
    target = out_dir / f"{bid}" / f"higgsfield-{higgsfield.__version__}-py3-none-any.whl"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    root = source_root()
    with tempfile.TemporaryDirectory(prefix="hf-wheel-") as tmp:
        if root is not None:
            built = _pip_wheel(root, Path(tmp))
        else:
            built = _repack_installed(Path(tmp))
        shutil.move(str(built), target)
    return target


def _pip_wheel(root: Path, tmp: Path) -> Path:
    src = tmp / "src"
    src.mkdir()
    for item in _SOURCE_ITEMS:
        p = root / item
        if p.is_file():
            shutil.copy2(p, src / item)
        elif p.is_dir():
            shutil.copytree(p, src / item, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    out = tmp / "dist"
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
            str(src)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)  # noqa: S603 - fixed argv
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise WheelError("cannot build the higgsfield wheel for the nodes: " + " | ".join(tail))
    wheels = list(out.glob("higgsfield-*.whl"))
    if len(wheels) != 1:
        raise WheelError(f"pip wheel produced {len(wheels)} higgsfield wheels in {out}")
    return wheels[0]


def _repack_installed(tmp: Path) -> Path:
    """Rebuild the wheel from an installed (non-editable) distribution's RECORD."""
    dist = md.distribution(DIST)
    files = [f for f in (dist.files or []) if not str(f).startswith("..") and "__pycache__" not in str(f)
             and not str(f).endswith((".pyc", "RECORD", "INSTALLER", "REQUESTED", "direct_url.json"))]
    version = dist.version
    info = f"higgsfield-{version}.dist-info"
    target = tmp / f"higgsfield-{version}-py3-none-any.whl"
    record: list[tuple[str, str, str]] = []
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for f in files:
            data = Path(str(f.locate())).read_bytes()
            name = str(f).replace("\\", "/")
            z.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append((name, f"sha256={digest}", str(len(data))))
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerows([*record, (f"{info}/RECORD", "", "")])
        z.writestr(f"{info}/RECORD", buf.getvalue())
    return target


def wheel_requirements(wheel: Path) -> list[str]:
    """The ``Requires-Dist`` lines of a wheel's METADATA: what pip will ask for when it installs it."""
    with zipfile.ZipFile(wheel) as z:
        name = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
        if name is None:
            raise WheelError(f"{wheel.name} has no METADATA")
        meta = email.parser.Parser().parsestr(z.read(name).decode())
    return list(meta.get_all("Requires-Dist") or [])


def runtime_requirements(wheel: Path | None = None) -> list[str]:
    """The runtime dependencies, pinned to the versions installed on the control side.

    Read from ``wheel`` (what the nodes will install) when given: the installed
    metadata of an editable checkout can be older than its pyproject.toml (a
    dependency added since ``pip install -e``), and a wheelhouse built from it would
    miss that dependency, which ``pip install --no-index`` on the node cannot find.
    """
    reqs: list[str] = []
    for req in wheel_requirements(wheel) if wheel is not None else (md.requires(DIST) or []):
        if "extra ==" in req:
            continue
        name = re.split(r"[\s;<>=!~\[]", req, maxsplit=1)[0]
        try:
            reqs.append(f"{name}=={md.version(name)}")
        except md.PackageNotFoundError:
            reqs.append(req.split(";")[0].strip())
    return reqs


def _platforms(py: NodePython) -> list[str]:
    plats = [f"linux_{py.machine}"]
    if py.glibc:
        major, minor = (int(x) for x in py.glibc.split(".")[:2])
        plats += [f"manylinux_{major}_{m}_{py.machine}" for m in range(17, minor + 1)]
        plats += [f"manylinux2014_{py.machine}", f"manylinux2010_{py.machine}", f"manylinux1_{py.machine}"]
    return plats


def build_wheelhouse(cache_dir: Path, py: NodePython, wheel: Path | None = None) -> Path | None:
    """Dependency wheels of ``wheel`` for ``py`` (cached), or None when they cannot be downloaded here."""
    base = cache_dir / "wheelhouse" / py.tag
    reqs = [*runtime_requirements(wheel), "pip"]  # pip: to bootstrap the venv without ensurepip (slow)
    stamp = base / ".requirements"
    if stamp.is_file() and stamp.read_text() == "\n".join(reqs):
        return base
    abi = f"cp{py.version.replace('.', '')}"
    common = ["--only-binary=:all:", "--python-version", py.version, "--implementation", "cp",
              "--abi", abi, "--abi", "abi3", "--abi", "none"]
    for p in _platforms(py):
        common += ["--platform", p]
    with tempfile.TemporaryDirectory(prefix="hf-wheelhouse-") as tmp:
        for attempt in (reqs, [r.split("==")[0] for r in reqs]):  # pinned, then the latest that fits
            argv = [sys.executable, "-m", "pip", "download", "-q", *common, "-d", tmp, *attempt]
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)  # noqa: S603
            if proc.returncode == 0:
                break
            for f in Path(tmp).iterdir():
                f.unlink()
        else:
            return None
        if base.exists():
            shutil.rmtree(base)
        base.mkdir(parents=True)
        for f in Path(tmp).glob("*.whl"):
            shutil.move(str(f), base / f.name)
    stamp.write_text("\n".join(reqs))
    return base


class Artifacts:
    """Builds the wheel and wheelhouses once per setup run, off the event loop, shared by all nodes."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self._lock = asyncio.Lock()
        self._wheel: Path | None = None
        self._houses: dict[str, Path | None] = {}

    async def wheel(self) -> Path:
        async with self._lock:
            if self._wheel is None:
                self._wheel = await asyncio.to_thread(build_wheel, self.cache_dir)
            return self._wheel

    async def wheelhouse(self, py: NodePython) -> Path | None:
        wheel = await self.wheel()
        async with self._lock:
            if py.tag not in self._houses:
                self._houses[py.tag] = await asyncio.to_thread(build_wheelhouse, self.cache_dir, py, wheel)
            return self._houses[py.tag]

"""What a built image runs with: its Python, CUDA and every package, listed once per build by deploy.

An image's tag hashes its Dockerfile, requirements.txt and the base image's *name*, but each node
builds its own image. An unpinned requirement (``transformers``) or a base tag that moved
(``pytorch/pytorch:latest``) gives two nodes different packages under one tag, and a run across
them fails at init or at its first checkpoint load. So :func:`listed` runs the image once, right
after deploy builds it (one short container, its network off, as the image's default user) and
asks its Python for its distributions. The answer goes into ``image.json`` beside the tag, and
``invoker facts`` compares it like a venv's, so ``run`` and ``doctor`` see drift inside images too.

The listing never fails a deploy: an image without a Python on its PATH, or one that does not
answer, keeps ``packages: null`` ("not known"), which the comparison leaves out, as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from higgsfield.contract.codec import DecodeError, decode, rule
from higgsfield.contract.drift import package_versions

LIST_TIMEOUT_S = 120.0
"""Starting the container and importing nothing but importlib.metadata: about a second; a slow disk more."""

SEPARATORS = r"[-_.]+"
"""What a package name's canonical form turns into one ``-`` (PEP 503)."""
CUDA_LINE = r"^cuda(?:: \S+)?\s*=\s*['\"]([^'\"]+)['\"]"
"""The line of ``torch/version.py`` that holds ``torch.version.cuda`` (multi-line mode)."""

# Runs inside the image, with its own Python (which has no higgsfield): stdlib only, one JSON line out. facts.py
# reads a venv with the same two patterns, so an image's names and CUDA read exactly as a venv's do.
SCRIPT = f"""
import importlib.metadata as m, json, re, sys
pk = {{}}
for d in m.distributions():
    name = d.metadata["Name"]
    if name:
        pk[re.sub({SEPARATORS!r}, "-", name).lower()] = d.version
cuda = None
try:
    text = open(m.distribution("torch").locate_file("torch/version.py")).read()
    found = re.search({CUDA_LINE!r}, text, re.M)
    cuda = found[1] if found else None
except Exception:
    pass
print(json.dumps({{"python": ".".join(map(str, sys.version_info[:3])), "cuda": cuda, "packages": pk}}))
"""


def _version(v: object) -> str | None:
    """A version string; anything else (or a string too long to be one) is not known."""
    return v if isinstance(v, str) and len(v) < 64 else None


@dataclass(frozen=True)
class ImageFacts:
    """The image's Python (``3.11.7``), ``torch.version.cuda`` (None: a CPU build or no torch), its packages."""

    packages: dict[str, str] = field(metadata=rule(decode=package_versions))
    python: str | None = field(default=None, metadata=rule(decode=_version))
    cuda: str | None = field(default=None, metadata=rule(decode=_version))


@dataclass(frozen=True)
class ImageRecord:
    """``image.json``: the image deploy last built for the project, what it was built from, and its facts as
    listed right after the build (left out when its Python did not answer). Empty when there is none."""

    tag: str | None = None
    dockerfile: str = "Dockerfile"
    base_image: str | None = None
    built_at: float | None = None
    packages: object = None
    python: object = field(default=None, metadata=rule(sparse=True))
    cuda: object = field(default=None, metadata=rule(sparse=True))

    @property
    def facts(self) -> ImageFacts | None:
        """The listed facts, or None when they are not known (or do not decode: a listing never trusted)."""
        return facts_of({"packages": self.packages, "python": self.python, "cuda": self.cuda})


def read_image_record(path: Path) -> ImageRecord:
    """The record at ``path``; an empty one when there is none or it does not decode."""
    try:
        return decode(ImageRecord, json.loads(path.read_text()))
    except (OSError, ValueError):   # DecodeError is a ValueError
        return ImageRecord()


def facts_of(data: object) -> ImageFacts | None:
    """The facts in ``data`` (a listing's output, or image.json's), or None for any other shape."""
    try:
        return decode(ImageFacts, data)
    except DecodeError:
        return None


def listed(tag: str) -> ImageFacts | None:
    """Ask image ``tag``'s Python (``python``, else ``python3``) for its facts; None when it cannot say."""
    from higgsfield.node.runtime import containers

    cl = containers.client(timeout=LIST_TIMEOUT_S)
    try:
        for exe in ("python", "python3"):
            try:
                out = cl.containers.run(tag, ["-c", SCRIPT], entrypoint=[exe], remove=True, network_disabled=True,
                                        stdout=True, stderr=False)
            except Exception:  # noqa: BLE001 - no such executable, or it failed: the next, else not known
                continue
            try:
                text = out.decode("utf-8", "replace").strip().splitlines()[-1]
                return facts_of(json.loads(text))
            except (IndexError, ValueError):
                return None
        return None
    finally:
        cl.close()

"""What a project environment is made of: requirements.txt, what deploy adds to it, and the key of the two.

The key hashes requirements.txt, the torch requirement added to it and the node's
Python (major.minor), the way the image tag hashes the Dockerfile and requirements:
an unchanged environment is never rebuilt (:mod:`higgsfield.node.code.environment`).

- **torch**: when requirements.txt names no ``torch``, :data:`DEFAULT_TORCH` is added;
  so is ``numpy`` (:data:`LIBRARY_NEEDS`: the training library needs it, torch's wheel
  does not bring it).
  A line of the project's own picks the build: ``torch==2.6.0`` (a version), a
  ``--extra-index-url https://download.pytorch.org/whl/cu124`` line (a CUDA flavour),
  or ``torch @ https://...whl`` (a file).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from higgsfield.contract.errors import RunError

DEFAULT_TORCH = "torch"
"""Added when requirements.txt names no torch (pip then picks the newest build for the node)."""
LIBRARY_NEEDS = ("numpy",)
"""What higgsfield's training library needs that torch's wheel does not bring, added when requirements.txt
names none: numpy, for torch.distributed's object collectives (``Checkpoint`` agrees on its layout with
``broadcast_object_list``, which fails with "Numpy is not available" on a rank without it)."""
FORMAT = "1"  # bump when the layout of an environment changes: every node rebuilds


def lists(requirements: str, name: str) -> bool:
    """Whether requirements.txt names ``name`` itself (any spec: ``torch``, ``torch==2.6``, ``torch @ URL``).

    Each line is read as pip reads a requirement (``packaging``): names compare
    canonicalised (``Torch``, ``torch_x`` and ``torch-x`` are one name), per-line options
    (``--hash=...``) are left out, and option lines (``-r``, ``--index-url``...),
    comments and what is not a requirement (a path, a bare VCS URL) name nothing. A
    package pulled in only through ``-r other.txt`` is not seen (list it here).
    """
    wanted = canonicalize_name(name)
    for raw in requirements.splitlines():
        line = raw.split(" #", 1)[0].split(" --", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        try:
            if canonicalize_name(Requirement(line).name) == wanted:
                return True
        except InvalidRequirement:
            continue
    return False


def lists_torch(requirements: str) -> bool:
    return lists(requirements, "torch")


def torch_added(requirements: str) -> str | None:
    """The torch requirement deploy adds, or None when requirements.txt has its own."""
    return None if lists_torch(requirements) else DEFAULT_TORCH


def added(requirements: str) -> list[str]:
    """Everything deploy adds to requirements.txt: torch (:func:`torch_added`) and :data:`LIBRARY_NEEDS`
    that the file does not name (its own line, with its own pin, wins)."""
    torch = torch_added(requirements)
    return [*([torch] if torch else []), *(n for n in LIBRARY_NEEDS if not lists(requirements, n))]


def env_key(requirements: str, python: tuple[int, int] | None = None) -> str:
    """``<12 hex>-py<MAJ><MIN>``: hash of requirements.txt + what deploy adds to it + the format."""
    py = python or sys.version_info[:2]
    h = hashlib.sha256()
    for part in (FORMAT, requirements, " ".join(added(requirements))):
        h.update(part.encode() + b"\0")
    return f"{h.hexdigest()[:12]}-py{py[0]}{py[1]}"


def read_requirements(code_dir: Path) -> str:
    p = Path(code_dir) / "requirements.txt"
    try:
        return p.read_text()
    except FileNotFoundError:
        return ""
    except OSError as e:
        raise RunError(f"cannot read {p}: {e.strerror}") from None

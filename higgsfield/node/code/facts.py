"""What this node would run a run of a project with: the facts ``doctor`` and ``run`` compare across nodes.

Read from what deploy and setup left on disk, so ``invoker facts`` answers in the
time the invoker takes to start (about 0.1 s) and ``run`` pays one round trip on the
connections it already holds (:mod:`higgsfield.contract.drift` says why and what):

- the environment a run would use, chosen as :func:`higgsfield.node.runs.start.choose_runtime`
  does, but without asking Docker (``auto`` with a recorded image is the image): its
  key (the project venv's key, or the image tag) and, for the venv, every package with
  its version, read from its ``*.dist-info`` directories (a ``pip install`` by hand
  after deploy shows here), Python from ``pyvenv.cfg``, CUDA from ``torch/version.py``
  and NCCL from the ``nvidia-nccl-*`` wheel torch depends on;
- the NVIDIA driver and the GPUs from ``/proc/driver/nvidia`` (no ``nvidia-smi``);
- the invoker's own version.

An image's facts are the ones deploy listed right after building it, kept in image.json
(:mod:`higgsfield.node.code.image_facts`): its tag hashes the Dockerfile, requirements.txt
and the base image's name, but each node builds its own, so equal tags can hide different
packages. An image deployed before that listing existed has ``packages: None`` (not known).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from higgsfield import __version__
from higgsfield.contract.drift import NodeFacts
from higgsfield.node.code.image_facts import CUDA_LINE, SEPARATORS
from higgsfield.node.state.home import NodeState

NVIDIA = Path("/proc/driver/nvidia")
_DIST = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._]*?)-(?P<version>[^-]+)\.dist-info$")


def _canonical(name: str) -> str:
    return re.sub(SEPARATORS, "-", name).lower()


def site_packages(env_dir: Path) -> Path | None:
    """The venv's site-packages (whatever its Python's minor version), or None."""
    found = sorted(Path(env_dir).glob("lib/python3*/site-packages"))
    return found[0] if found else None


def packages(site: Path) -> dict[str, str]:
    """Canonical name -> version of every distribution installed in ``site`` (from the dist-info names)."""
    out: dict[str, str] = {}
    try:
        entries = list(site.iterdir())
    except OSError:
        return out
    for p in entries:
        m = _DIST.match(p.name)
        if m:
            out[_canonical(m["name"])] = m["version"]
    return out


def _venv_python(env_dir: Path) -> str | None:
    try:
        for line in (Path(env_dir) / "pyvenv.cfg").read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() in ("version", "version_info"):
                return ".".join(value.strip().split(".")[:3])
    except OSError:
        pass
    return None


def torch_cuda(site: Path) -> str | None:
    """``torch.version.cuda`` read from the file, not imported (None: a CPU build, or no torch)."""
    try:
        text = (site / "torch" / "version.py").read_text()
    except OSError:
        return None
    m = re.search(CUDA_LINE, text, re.M)
    return m[1] if m else None


def nccl(pkgs: dict[str, str]) -> str | None:
    return next((v for k, v in sorted(pkgs.items()) if k.startswith("nvidia-nccl")), None)


def gpus() -> tuple[str | None, str | None, int | None]:
    """(driver version, GPU model, GPU count) from ``/proc/driver/nvidia``; Nones where there is no driver."""
    try:
        text = (NVIDIA / "version").read_text()
    except OSError:
        return None, None, None
    m = re.search(r"Kernel Module(?: for [^ ]+)?\s+([0-9][0-9.]*)", text)
    driver = m[1] if m else text.split("\n", 1)[0].strip()[:80]
    models: list[str] = []
    try:
        for info in sorted((NVIDIA / "gpus").glob("*/information")):
            mm = re.search(r"^Model:\s*(.+)$", info.read_text(), re.M)
            models.append(mm[1].strip() if mm else "?")
    except OSError:
        pass
    model = ", ".join(sorted(set(models))) or None
    return driver, model, len(models)


def facts(home: NodeState, project: str, runtime: str, node: str = "") -> NodeFacts:
    """This node's :class:`NodeFacts` for a run of ``project`` with ``runtime`` (auto, docker, process)."""
    from higgsfield.node.code import deploy, environment

    driver, model, count = gpus()
    base = {"node": node, "invoker": __version__, "driver": driver, "gpu_model": model, "gpu_count": count}
    record = None if runtime == "process" else deploy.image_record(home, project)
    image = record.tag if record else None
    if record and image is not None:
        listed = record.facts
        if listed is None:   # deployed before images were listed, or its Python did not answer: not known
            return NodeFacts(runtime="docker", env_key=image, **base)  # type: ignore[arg-type]
        pk = listed.packages
        return NodeFacts(runtime="docker", env_key=image, python=listed.python, torch=pk.get("torch"),
                         cuda=listed.cuda, nccl=nccl(pk), packages=pk, **base)  # type: ignore[arg-type]
    st = environment.status(home, project)
    if st.state != "present":
        # No venv built for the deployed code: the run would use this Python (a localhost node) or refuse.
        site = next((Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()), None)
        pkgs = packages(site) if site else {}
        py: str | None = ".".join(str(x) for x in sys.version_info[:3])
        key = None
    else:
        env_dir = Path(str(st.python)).parent.parent
        site = site_packages(env_dir)
        pkgs = packages(site) if site else {}
        py = _venv_python(env_dir)
        key = str(st.key)
    return NodeFacts(runtime="process", env_key=key, python=py, torch=pkgs.get("torch"),
                     cuda=torch_cuda(site) if site else None, nccl=nccl(pkgs), packages=pkgs,
                     **base)  # type: ignore[arg-type]

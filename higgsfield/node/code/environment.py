"""The project environment of ``runtime: process``: a venv per node, built by deploy from requirements.txt.

Plain processes need what a training image would give them: torch and the project's
requirements, in an environment of the project's own (never the invoker's venv,
whose pinned control-side packages must not decide the project's versions)::

    <state>/envs/<project>/<key>/              the venv; ``.complete`` once built and verified
    <state>/projects/<project>/env.json        {key, python, torch, built_at, seconds}
    <state>/projects/<project>/env-build.log   pip's full output of the last build

The key hashes requirements.txt, the torch requirement added to it and the node's
Python (major.minor), the way the image tag hashes the Dockerfile and requirements:
an unchanged environment is never rebuilt, and a changed one is built beside the old
one, which a running run keeps using until it ends.

- **torch**: when requirements.txt names no ``torch``, :data:`DEFAULT_TORCH` is added;
  so is ``numpy`` (:data:`LIBRARY_NEEDS`: the training library needs it, torch's wheel
  does not bring it).
  A line of the project's own picks the build: ``torch==2.6.0`` (a version), a
  ``--extra-index-url https://download.pytorch.org/whl/cu124`` line (a CUDA flavour),
  or ``torch @ https://...whl`` (a file).
- **higgsfield**: not installed from an index. The venv's ``higgsfield-invoker.pth``
  puts ``<venv>/higgsfield-invoker`` first on ``sys.path``, and that directory holds a
  single link, ``higgsfield``, to the invoker's own package: the same code the Docker
  runtime mounts at ``/opt/higgsfield-invoker``. A run therefore uses the nodes' exact
  build (a checkout, a fork, a pre-release), ``higgsfield setup`` upgrading the invoker
  upgrades every environment at once, and none of the invoker's dependencies
  (pydantic, asyncssh...) leak into the project's environment.
- **pip, not uv**: pip honours the node's own pip configuration (``/etc/pip.conf``:
  a cluster's mirror, a wheel directory, constraints), which is how shared clusters
  point at their packages; uv reads none of it. pip is also already there (the
  invoker's venv has it), so nothing more is shipped. It runs as the invoker's pip
  aimed at the new venv (``pip --python``), without compiling; ``compileall`` then
  uses every core.

The control side's ``doctor`` reads :func:`status` through the invoker. One concept, the
project environment's life (its key, build, status, prune), so one module of a little
over 400 lines.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from higgsfield.contract.errors import RunError
from higgsfield.node.state.locks import exclusive

DEFAULT_TORCH = "torch"
"""Added when requirements.txt names no torch (pip then picks the newest build for the node)."""
LIBRARY_NEEDS = ("numpy",)
"""What higgsfield's training library needs that torch's wheel does not bring, added when requirements.txt
names none: numpy, for torch.distributed's object collectives (``Checkpoint`` agrees on its layout with
``broadcast_object_list``, which fails with "Numpy is not available" on a rank without it)."""
FORMAT = "1"  # bump when the layout of an environment changes: every node rebuilds
BUILD_TIMEOUT_S = 3600.0
LINK_DIR = "higgsfield-invoker"
PTH_NAME = "higgsfield-invoker.pth"
COMPLETE = ".complete"
_SHOWN = ("Collecting ", "Processing ", "Installing collected packages", "Successfully installed", "ERROR")

Progress = Callable[[str], None]


# -- what the environment is made of -------------------------------------------------

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


def _read_requirements(code_dir: Path) -> str:
    p = Path(code_dir) / "requirements.txt"
    try:
        return p.read_text()
    except FileNotFoundError:
        return ""
    except OSError as e:
        raise RunError(f"cannot read {p}: {e.strerror}") from None


# -- where it lives -----------------------------------------------------------------

def envs_root(state_dir: Path, project: str) -> Path:
    return Path(state_dir) / "envs" / project


def record_path(state_dir: Path, project: str) -> Path:
    return Path(state_dir) / "projects" / project / "env.json"


def log_path(state_dir: Path, project: str) -> Path:
    return Path(state_dir) / "projects" / project / "env-build.log"


def env_python(env_dir: Path) -> Path:
    return Path(env_dir) / "bin" / "python"


def _site_packages(env_dir: Path) -> Path:
    return Path(env_dir) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def invoker_package() -> Path:
    """The invoker's own ``higgsfield`` package directory (what the Docker runtime mounts, too)."""
    import higgsfield

    return Path(higgsfield.__file__).resolve().parent


def _code_dir(state_dir: Path, project: str, code_dir: Path | None) -> Path:
    code = Path(code_dir) if code_dir else Path(state_dir) / "projects" / project / "code"
    if not code.is_dir():
        raise RunError(f"project '{project}' is not deployed on this node ({code} is missing): "
                       "run 'higgsfield deploy'")
    return code.resolve()


def _read_record(state_dir: Path, project: str) -> dict[str, Any] | None:
    try:
        data = json.loads(record_path(state_dir, project).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _complete(env_dir: Path) -> bool:
    return (Path(env_dir) / COMPLETE).is_file() and env_python(env_dir).exists()


# -- status -------------------------------------------------------------------------

def status(state_dir: Path, project: str, code_dir: Path | None = None) -> dict[str, Any]:
    """``{"state": "present" | "stale" | "missing", ...}`` for the deployed code (or ``code_dir``).

    present: built for this requirements.txt; stale: an environment exists, built for
    another requirements.txt (a deploy did not finish); missing: none, or a half-built one.
    """
    out: dict[str, Any] = {"state": "missing", "project": project}
    rec = _read_record(state_dir, project)
    try:
        code = _code_dir(state_dir, project, code_dir)
    except RunError:
        code = None
    if code is not None:
        want = env_key(_read_requirements(code))
        out["wanted"] = want
        env_dir = envs_root(state_dir, project) / want
        if _complete(env_dir):
            return {**out, **(rec if rec and rec.get("key") == want else {}), "state": "present", "key": want,
                    "python": str(env_python(env_dir))}
    if rec and _complete(Path(rec.get("dir", ""))):
        return {**out, **rec, "state": "stale" if code is not None else "present"}
    return out


def python_for_run(state_dir: Path, project: str, code_dir: Path) -> str:
    """The interpreter a process-runtime run of ``code_dir`` starts torchrun with.

    The project environment when it matches the code's requirements.txt. Without one,
    the invoker's own interpreter, only if it has torch (a ``localhost`` node runs in
    the user's Python); otherwise a RunError that says to deploy.
    """
    st = status(state_dir, project, code_dir)
    if st["state"] == "present":
        return str(st["python"])
    if st["state"] == "stale":
        raise RunError(f"the project environment of '{project}' on this node was built for another "
                       "requirements.txt: run 'higgsfield deploy' to rebuild it")
    if importlib.util.find_spec("torch") is not None:
        return sys.executable
    raise RunError(f"runtime 'process' needs the project environment of '{project}' (a venv with torch and "
                   "requirements.txt), which is missing on this node: run 'higgsfield deploy'")


# -- build --------------------------------------------------------------------------

def _locked(root: Path) -> contextlib.AbstractContextManager[None]:
    """One build per project and node at a time (two deploys at once wait for each other)."""
    return exclusive(root / ".lock")


def link_invoker(env_dir: Path) -> None:
    """Point the environment's ``higgsfield`` at the invoker's package (first on ``sys.path``)."""
    links = Path(env_dir) / LINK_DIR
    links.mkdir(exist_ok=True)
    link = links / "higgsfield"
    target = invoker_package()
    if not (link.is_symlink() and Path(os.readlink(link)) == target):
        tmp = links / f".higgsfield-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target, target_is_directory=True)
        os.replace(tmp, link)
    site = _site_packages(env_dir)
    site.mkdir(parents=True, exist_ok=True)
    # An "import" line of a .pth runs at start-up: put the link first, as PYTHONPATH does in a container.
    line = f"import sys; p = {str(links)!r}; p in sys.path or sys.path.insert(0, p)\n"
    pth = site / PTH_NAME
    if not pth.is_file() or pth.read_text() != line:
        pth.write_text(line)


def _pip(env_dir: Path) -> list[str]:
    """pip aimed at ``env_dir``: the invoker's own (``--python``, pip >= 22.3), else the venv's own."""
    if importlib.util.find_spec("pip") is not None:
        try:
            version = tuple(int(x) for x in importlib.metadata.version("pip").split(".")[:2])
        except (importlib.metadata.PackageNotFoundError, ValueError):
            version = (0, 0)
        if version >= (22, 3):
            return [sys.executable, "-m", "pip", "--python", str(env_python(env_dir))]
    return [str(env_python(env_dir)), "-m", "pip"]


def _run_logged(argv: list[str], log: Any, progress: Progress, *, deadline: float, what: str) -> None:
    """Run ``argv``, its output appended to ``log``; pip's milestones go to ``progress``."""
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,  # noqa: S603
                            stdin=subprocess.DEVNULL, env={**os.environ, "PIP_PROGRESS_BAR": "off",
                                                           "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    timer = threading.Timer(max(1.0, deadline - time.monotonic()), proc.kill)
    timer.start()
    tail: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            text = line.strip()
            if text and not text.startswith("WARNING: Location"):
                tail = [*tail[-4:], text]
            if text.startswith(_SHOWN):
                progress(text if len(text) <= 160 else text[:157] + "...")
        rc = proc.wait()
    finally:
        timer.cancel()
        log.flush()
    if time.monotonic() >= deadline and rc != 0:
        raise RunError(f"{what} took over {BUILD_TIMEOUT_S:.0f}s and was stopped (log: {log.name})")
    if rc != 0:
        last = next((t for t in reversed(tail) if t.startswith("ERROR")), tail[-1] if tail else "no output")
        raise RunError(f"{what} failed: {last} (log: {log.name})")


def build(state_dir: Path, project: str, *, code_dir: Path | None = None,
          progress: Progress = lambda _msg: None, timeout: float = BUILD_TIMEOUT_S) -> dict[str, Any]:
    """Build the environment for the deployed code's requirements.txt unless it exists; returns what happened."""
    code = _code_dir(state_dir, project, code_dir)
    requirements = _read_requirements(code)
    key = env_key(requirements)
    root = envs_root(state_dir, project)
    env_dir = root / key
    t0 = time.monotonic()
    with _locked(root):
        built = not _complete(env_dir)
        if built:
            _create(env_dir, code, requirements, log_path(state_dir, project), progress,
                    deadline=t0 + timeout)
        else:
            progress("unchanged")
        link_invoker(env_dir)
        rec = _read_record(state_dir, project) or {}
        if built or rec.get("key") != key:
            facts = _verify(env_dir, progress) if built else _facts(env_dir)
            rec = {"key": key, "dir": str(env_dir), "python": str(env_python(env_dir)),
                   "torch": facts.get("torch"), "torch_added": torch_added(requirements),
                   "built_at": time.time() if built else rec.get("built_at"),
                   "seconds": round(time.monotonic() - t0, 2) if built else rec.get("seconds")}
            record_path(state_dir, project).parent.mkdir(parents=True, exist_ok=True)
            from higgsfield.node.state.records import write_json

            write_json(record_path(state_dir, project), rec)
        removed = prune(state_dir, project, keep=env_dir)
    return {**rec, "built": built, "pruned": removed, "seconds": round(time.monotonic() - t0, 3)}


def _create(env_dir: Path, code: Path, requirements: str, log_file: Path, progress: Progress, *,
            deadline: float) -> None:
    shutil.rmtree(env_dir, ignore_errors=True)  # a half-built one from an interrupted deploy
    log_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(log_file, "w") as log:
            progress("creating the venv")
            venv = [sys.executable, "-m", "venv", "--without-pip", str(env_dir)]
            pip = _pip(env_dir)
            if pip[0] != sys.executable:  # no usable pip here: the venv brings its own
                venv.remove("--without-pip")
            _run_logged(venv, log, progress, deadline=deadline, what="creating the venv")
            extra = added(requirements)
            reqs = ["-r", str(code / "requirements.txt")] if (code / "requirements.txt").is_file() else []
            n = sum(1 for ln in requirements.splitlines() if ln.strip() and not ln.strip().startswith(("#", "-")))
            progress(f"installing {n} requirement(s) from requirements.txt"
                     + (f" + {' '.join(extra)} (not in requirements.txt)" if extra else ""))
            _run_logged([*pip, "install", "--no-compile", "--no-input", *reqs, *extra],
                        log, progress, deadline=deadline, what="pip install of the project environment")
            progress("compiling")
            # best effort, as pip's own compile step: some packages ship files for other Pythons
            with contextlib.suppress(RunError):
                _run_logged([str(env_python(env_dir)), "-m", "compileall", "-q", "-j", "0",
                             str(_site_packages(env_dir))], log, lambda _m: None, deadline=deadline,
                            what="compiling the project environment")
    except BaseException:
        shutil.rmtree(env_dir, ignore_errors=True)
        raise


def _verify(env_dir: Path, progress: Progress) -> dict[str, Any]:
    """Import torch and higgsfield with the new python: the environment is complete only if both load."""
    link_invoker(env_dir)
    probe = ("import json, torch, higgsfield.node.entrypoint as e; "
             "print(json.dumps({'torch': torch.__version__, 'higgsfield': e.__file__}))")
    r = subprocess.run([str(env_python(env_dir)), "-c", probe], capture_output=True, text=True,  # noqa: S603
                       timeout=300, cwd=env_dir)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        shutil.rmtree(env_dir, ignore_errors=True)
        raise RunError(f"the new project environment does not import torch and higgsfield: {tail}")
    facts: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    if not Path(facts["higgsfield"]).resolve().is_relative_to(invoker_package()):
        shutil.rmtree(env_dir, ignore_errors=True)
        raise RunError(f"the project environment imports higgsfield from {facts['higgsfield']}, not the "
                       f"invoker's {invoker_package()}")
    (env_dir / COMPLETE).write_text(json.dumps(facts) + "\n")
    progress(f"ready: torch {facts['torch']}")
    return facts


def _facts(env_dir: Path) -> dict[str, Any]:
    """What :func:`_verify` found when it completed ``env_dir`` (torch's version, higgsfield's path)."""
    try:
        data = json.loads((Path(env_dir) / COMPLETE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def prune(state_dir: Path, project: str, *, keep: Path) -> list[str]:
    """Remove the project's other environments, except those an active run still uses."""
    from higgsfield.contract.runspec import ACTIVE
    from higgsfield.node.state.placement import NodeRun
    from higgsfield.node.state.records import list_runs

    root = envs_root(state_dir, project)
    in_use = {Path(keep).resolve()}
    for rd in list_runs(state_dir, project):
        with contextlib.suppress(OSError, ValueError, RunError):
            python = NodeRun.read(rd.spec_path).placement.python
            if python and rd.read().state in ACTIVE:
                in_use.add(Path(python).parent.parent.resolve())
    removed = []
    for d in root.iterdir() if root.is_dir() else []:
        if d.is_dir() and not d.name.startswith(".") and d.resolve() not in in_use:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d.name)
    return sorted(removed)

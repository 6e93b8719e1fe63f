"""The README's install lines work: the wheel and the sdist, each in a fresh venv, then a new user's first run.

`pip install higgsfield` from PyPI gets an unrelated project of that name, so users install
from a checkout or the repository URL; pip builds the same wheel (or the sdist) either way.
Both are built (`python -m build`) from a copy of the checkout's files, so a build never
writes into the checkout. Each is installed into a venv of its own: torch first and pinned,
then the artifact with its `[train]` extra, and a new user's first two commands run there:
`higgsfield init demo` and, in the project, `higgsfield run example` on its one `localhost`
node (it trains on CPU).

torch is the slow part of an install and the same in both venvs, so it is installed once for
the module (`pip install --target`) into a directory that holds torch and its dependencies
only, and each venv sees that directory through a `.pth` file in its site-packages (as a
pip-installed torch would be seen): pip then finds torch already satisfied when it installs
the artifact, and each venv checks that its torch is the shared one and that higgsfield is its
own copy.

The sdist's venv runs ``init`` but not the training run: instead its installed files are proven
equal to the wheel's, byte for byte (the package, its templates, its entry points and its
requirements), so the wheel's run is the sdist's too. A run is a torch launch (a project
environment, torchrun and its ranks): the suite's time goes to launches.

Everything runs with cwd under tmp_path and without PYTHONPATH or the dev venv, so only the
installed copy of higgsfield can be imported. pip keeps this machine's configuration (HOME
and its pip.conf, the find-links holding torch's CPU wheel, the pip cache): the second venv's
installs come from the cache. The higgsfield commands get a HOME of their own, so the run's
state, the deploy key and the caches stay in tmp_path.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"   # pinned: the CPU wheel this kind of machine has; unpinned pulls the CUDA build

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

#: Variables that would let the checkout, the dev venv or the user's site-packages be imported.
_LEAKS = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV", "PIP_USER",
          "PIP_PREFIX", "PIP_TARGET", "PIP_REQUIRE_VIRTUALENV", "PIP_NO_INDEX")


def _pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LEAKS and not k.startswith("HIGGSFIELD_")}
    env.update(PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def _cli_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in _pip_env().items() if not k.startswith("XDG_")}
    env.update(HOME=str(home), NO_COLOR="1")
    return env


def _run(argv: list[str | Path], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, (argv, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The wheel and the sdist, built by `python -m build` (isolated, PEP 517) from a copy of the checkout."""
    pytest.importorskip("build", reason="`build` is in the dev extra: pip install -e '.[dev]'")
    src, dist = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],  # noqa: S607
                            cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        if (REPO / rel).is_file():   # the working tree as it is (a file deleted there is not shipped)
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    _run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", dist, src],
         cwd=dist, env=_pip_env(), timeout=300)
    wheel, sdist = sorted(dist.glob("higgsfield-*.whl")), sorted(dist.glob("higgsfield-*.tar.gz"))
    assert len(wheel) == 1 and len(sdist) == 1, list(dist.iterdir())
    return {"wheel": wheel[0], "sdist": sdist[0]}


@pytest.fixture(scope="module")
def shared_torch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torch (pinned) and its dependencies, nothing else, in a directory of their own, installed once."""
    target = tmp_path_factory.mktemp("torch")
    # --no-compile: byte-compiling torch alone doubles the install's time
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--target", target, TORCH],
         cwd=target, env=_pip_env(), timeout=600)
    assert (target / "torch").is_dir() and not (target / "higgsfield").exists(), sorted(target.iterdir())
    return target


def _see_shared_torch(venv: Path, shared: Path) -> None:
    """``venv`` sees ``shared`` (torch and its dependencies) through a ``.pth`` file: after its own
    site-packages on sys.path, as pip sees installed packages there."""
    site = sorted(venv.glob("lib/python3*/site-packages"))
    assert len(site) == 1, site
    (site[0] / "shared-torch.pth").write_text(f"{shared}\n")


def _in_wheel(wheel: Path) -> dict[str, bytes]:
    """The wheel's files (path -> bytes), its RECORD left out (it lists hashes of the others)."""
    with zipfile.ZipFile(wheel) as z:
        return {n: z.read(n) for n in z.namelist() if not n.endswith("/") and not n.endswith(".dist-info/RECORD")}


def _installed(venv: Path) -> dict[str, bytes]:
    """The same view of what pip installed in ``venv``: the files its RECORD lists under site-packages, less
    pip's own (INSTALLER, REQUESTED, direct_url.json), the bytecode and the scripts outside site-packages."""
    site = sorted(venv.glob("lib/python3*/site-packages"))[0]
    info = sorted(site.glob("higgsfield-*.dist-info"))
    assert len(info) == 1, info
    pip_own = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}
    out = {}
    for row in csv.reader((info[0] / "RECORD").read_text().splitlines()):
        rel = row[0]
        if rel.startswith("..") or rel.endswith(".pyc") or (rel.startswith(info[0].name + "/")
                                                           and rel.split("/", 1)[1] in pip_own):
            continue
        out[rel] = (site / rel).read_bytes()
    return out


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_a_fresh_venv_installs_the_artifact_then_init_and_run_example_train(
        artifacts: dict[str, Path], shared_torch: Path, tmp_path: Path, kind: str) -> None:
    venv, home, work = tmp_path / "venv", tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    pip_env, cli_env = _pip_env(), _cli_env(home)
    python, higgsfield = venv / "bin" / "python", venv / "bin" / "higgsfield"

    _run([sys.executable, "-m", "venv", venv], cwd=work, env=pip_env, timeout=120)
    _see_shared_torch(venv, shared_torch)   # torch first: installed once for the module (shared_torch)
    _run([python, "-m", "pip", "install", "--quiet", "--no-compile", f"{artifacts[kind]}[train]"],
         cwd=work, env=pip_env, timeout=600)

    where = Path(_run([python, "-c", "import higgsfield; print(higgsfield.__file__)"],
                      cwd=work, env=cli_env, timeout=60).stdout.strip())
    assert where.is_relative_to(venv) and not where.is_relative_to(REPO), where
    # pip found torch satisfied: the venv imports the shared one, the pinned version, and has no torch of its own
    torch_at, version = _run([python, "-c", "import torch; print(torch.__file__); print(torch.__version__)"],
                             cwd=work, env=cli_env, timeout=120).stdout.split()
    assert Path(torch_at).is_relative_to(shared_torch) and version.split("+")[0] == TORCH.split("==")[1], \
        (torch_at, version)
    assert not list(venv.glob("lib/python3*/site-packages/torch")), "pip installed a torch into the venv"

    init = _run([higgsfield, "init", "demo"], cwd=work, env=cli_env, timeout=120)
    assert "Created project 'demo' in ./demo" in init.stdout
    assert (work / "demo" / "src" / "example.py").is_file()
    if kind == "sdist":   # what pip built from the sdist and installed is the wheel, file for file
        assert _installed(venv) == _in_wheel(artifacts["wheel"])
        return

    run = _run([higgsfield, "run", "example", "-p", "steps=30"], cwd=work / "demo", env=cli_env, timeout=300)
    # rank 0 prints "localhost/0 | step   10  loss 3.263998" at steps 1, 10, 20, 30
    losses = [float(line.split()[-1]) for line in run.stdout.splitlines() if "| step" in line and "loss" in line]
    assert len(losses) == 4 and losses[-1] < losses[0], run.stdout
    assert "succeeded" in run.stderr, run.stderr
    assert (home / ".higgsfield" / "runs" / "demo").is_dir()   # the run's state stayed in tmp_path

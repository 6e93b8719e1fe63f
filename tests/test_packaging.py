"""The built wheel works on its own: templates ship inside it and ``--help`` stays light.

Builds a wheel from a copy of the sources (so a concurrent test run's ``build/``
never interferes), installs it into a fresh venv, and runs the installed
``higgsfield``. Nothing is downloaded: the wheel is built without isolation, and
the new venv reaches the already-installed dependencies through a ``.pth`` line
(a plain path line: the dev venv's editable-install hook is not activated, so
``import higgsfield`` can only find the wheel's copy).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from helpers_project import cli_env

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, **kw)  # type: ignore[call-overload]
    assert proc.returncode == 0, (argv, proc.stdout[-2000:], proc.stderr[-2000:])
    return proc  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the venv it is installed in)."""
    base = tmp_path_factory.mktemp("pkg")
    src = base / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("higgsfield", "templates"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, src / name)
    _run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "--no-index",
          "-q", "-w", str(base / "dist")])
    (wheel,) = (base / "dist").glob("higgsfield-*.whl")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    purelib = Path(_run([str(venv / "bin" / "python"), "-c",
                         "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (purelib / "_deps_from_dev_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps",
          "--no-index", "-q", str(wheel)])
    return wheel, venv


def test_wheel_holds_the_templates(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.relative_to(REPO / "templates").as_posix() for p in (REPO / "templates").rglob("*.j2")}
    assert shipped, "no templates found in the repository"
    assert {f"higgsfield/templates/{p}" for p in shipped} <= names
    assert "higgsfield/templates/scaffold/higgsfield.yml.j2" in names
    assert not any(n.startswith("templates/") for n in names)


def test_wheel_holds_every_package(installed: tuple[Path, Path]) -> None:
    """pyproject.toml lists the packages by hand: a package directory left out of it is missing here."""
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {p.parent.relative_to(REPO).as_posix() for p in (REPO / "higgsfield").rglob("__init__.py")
                if "__pycache__" not in p.parts}
    assert "higgsfield/control/backends/slurm" in packages
    missing = sorted(p for p in packages if f"{p}/__init__.py" not in names)
    assert not missing, f"add these to pyproject.toml's packages = [...]: {[m.replace('/', '.') for m in missing]}"
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "higgsfield").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert not sorted(modules - names), "a module of a listed package is not in the wheel"


def test_wheel_holds_the_dashboard(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    static = {p.relative_to(REPO / "higgsfield").as_posix() for p in (REPO / "higgsfield/control/ui/static").rglob("*")
              if p.is_file()}
    assert {"control/ui/static/index.html", "control/ui/static/app.js",
            "control/ui/static/vendor/uPlot.iife.min.js"} <= static
    assert {f"higgsfield/{p}" for p in static} <= names
    assert "higgsfield/control/ui/app.py" in names and "higgsfield/metrics.py" in names


def test_installed_package_is_the_wheel(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, venv = installed
    out = _run([str(venv / "bin" / "python"), "-c", "import higgsfield, higgsfield.templates as t; "
                "print(higgsfield.__file__); print(t.__file__)"], cwd=tmp_path).stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in out), out


def test_init_renders_from_the_installed_wheel(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, venv = installed
    home = tmp_path / "home"
    env = cli_env(home)
    _run([str(venv / "bin" / "higgsfield"), "init", "demo"], cwd=tmp_path, env=env)
    root = tmp_path / "demo"
    for rel in ("higgsfield.yml", "src/example.py", "Dockerfile", "requirements.txt", ".gitignore", "env",
                "README.md"):
        assert (root / rel).is_file(), rel
    assert "name: demo" in (root / "higgsfield.yml").read_text()
    assert (home / "keys" / "demo" / "deploy_key.pub").is_file()
    out = _run([str(venv / "bin" / "higgsfield"), "config", "check"], cwd=root, env=env).stdout
    assert "name:           demo" in out


def test_help_imports_no_torch_from_the_wheel(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, venv = installed
    code = ("import sys\nfrom higgsfield.control.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n"
            "    pass\nprint('LOADED', sorted(m for m in ('torch', 'pydantic', 'rich', 'asyncssh', 'starlette', "
            "'uvicorn', 'higgsfield.control.ui') "
            "if m in sys.modules))\n")
    out = _run([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path, env=cli_env(tmp_path / "h")).stdout
    assert "Usage: higgsfield" in out
    assert out.strip().splitlines()[-1] == "LOADED []"

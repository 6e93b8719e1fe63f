"""``higgsfield init``, ``show-deploy-key`` and the generated project, end to end.

Every test points ``HIGGSFIELD_HOME_CONFIG`` at a temporary directory, so keys
never land in the real ``~/.config``.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers_project import assert_one_line_error, cli_env, run_cli

from higgsfield.contract.errors import ScaffoldError
from higgsfield.control.cli import cli
from higgsfield.control.project import scaffold
from higgsfield.control.project.discovery import discover

EXPECTED_FILES = {"higgsfield.yml", "src/example.py", "Dockerfile", "requirements.txt", ".gitignore",
                  ".dockerignore", "env", "README.md", ".higgsfield/higgsfield.schema.json"}


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private config home for in-process calls."""
    h = tmp_path / "home"
    monkeypatch.setenv("HIGGSFIELD_HOME_CONFIG", str(h))
    return h


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    monkeypatch.chdir(d)
    return d


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """One project made by the real CLI in a subprocess: (project dir, config home, the init process)."""
    base = tmp_path_factory.mktemp("init")
    home = base / "home"
    proc = run_cli(base, "init", "demo", home=home)
    return base / "demo", home, proc


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


# -- the real CLI -------------------------------------------------------------

def test_init_creates_everything(project: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    root, home, proc = project
    assert proc.returncode == 0, proc.stderr
    assert "Created project 'demo' in ./demo" in proc.stdout
    assert tree(root) == EXPECTED_FILES
    assert not [p for p in root.parent.iterdir() if p.name.startswith(".demo.")]  # no temp dir left


def test_init_file_modes(project: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    root, home, _ = project
    assert mode(root / "env") == 0o600
    key_dir = home / "keys" / "demo"
    assert mode(key_dir) == 0o700
    assert mode(home / "keys") == 0o700
    assert mode(key_dir / "deploy_key") == 0o600
    assert mode(key_dir / "deploy_key.pub") == 0o644
    assert not mode(root / "higgsfield.yml") & 0o022  # not group/world writable


def test_deploy_key_is_ed25519_outside_the_project(project: tuple[Path, Path, subprocess.CompletedProcess[str]]
                                                   ) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    root, home, proc = project
    priv = home / "keys" / "demo" / "deploy_key"
    assert not priv.resolve().is_relative_to(root.resolve())
    key = serialization.load_ssh_private_key(priv.read_bytes(), password=None)
    assert isinstance(key, Ed25519PrivateKey)
    pub = (home / "keys" / "demo" / "deploy_key.pub").read_text()
    derived = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    assert pub == f"{derived.decode()} higgsfield deploy key: demo\n"
    assert str(priv) in proc.stdout
    assert "BEGIN OPENSSH PRIVATE KEY" not in proc.stdout


def test_generated_config_checks_and_example_is_discovered(
        project: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    root, home, _ = project
    proc = run_cli(root, "config", "check", home=home)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "name:           demo" in proc.stdout
    (exp,) = discover(root / "src")
    assert (exp.name, exp.module, exp.function, exp.seed) == ("example", "example", "example", 0)
    assert {p.name: p.type for p in exp.params} == {"steps": "int", "lr": "float", "global_batch": "int",
                                                   "micro_batch": "int", "device": "str"}


def test_generated_config_matches_schema(project: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    import json

    root, _, _ = project
    schema = json.loads((root / ".higgsfield" / "higgsfield.schema.json").read_text())
    jsonschema.validate(yaml.safe_load((root / "higgsfield.yml").read_text()), schema)
    assert (root / "higgsfield.yml").read_text().startswith(
        "# yaml-language-server: $schema=.higgsfield/higgsfield.schema.json\n")


def test_generated_files_content(project: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    root, _, _ = project
    yml = (root / "higgsfield.yml").read_text()
    for needle in ("name: demo", "nodes:", "- host: localhost", "#  - host: gpu-1.example.com", "ssh:",
                   "nproc_per_node: auto", "secrets: []", "root is refused"):
        assert needle in yml, needle
    docker = (root / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=pytorch/pytorch:" in docker and "cuda" in docker
    assert "FROM ${BASE_IMAGE}" in docker
    assert "requirements.txt" in docker and "pip install" in docker
    # no higgsfield from an index (a checkout or fork has none there): runs mount the invoker's package
    assert "higgsfield==" not in docker and ".whl" not in docker and "install higgsfield" not in docker
    assert "at /project" not in docker and "WORKDIR /project" not in docker and "/opt/higgsfield-invoker" in docker
    env = (root / "env").read_text()
    assert all(line.startswith("#") for line in env.splitlines())  # only comments: no secret set
    assert "KEY=VALUE" in env
    assert "env" in (root / ".dockerignore").read_text().split()
    assert "# demo" in (root / "README.md").read_text()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_gitignore_keeps_secrets_and_state_out_but_known_hosts_in(
        project: tuple[Path, Path, subprocess.CompletedProcess[str]], tmp_path: Path) -> None:
    root, _, _ = project
    repo = tmp_path / "repo"
    shutil.copytree(root, repo)
    (repo / ".higgsfield" / "known_hosts").write_text("[h]:22 ssh-ed25519 AAAA\n")
    (repo / ".higgsfield" / "runs.json").write_text("{}")
    (repo / "deploy_key").write_text("x")
    (repo / "deploy_key.pub").write_text("x")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)  # noqa: S607
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],  # noqa: S607
                         cwd=repo, capture_output=True, text=True, check=True).stdout
    tracked = {line[3:] for line in out.splitlines()}
    assert tracked == {"higgsfield.yml", "src/example.py", "Dockerfile", "requirements.txt", ".gitignore",
                       ".dockerignore", "README.md", ".higgsfield/known_hosts"}


def test_show_deploy_key(project: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    root, home, _ = project
    proc = run_cli(root / "src", "show-deploy-key", home=home)  # from a subdirectory too
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (home / "keys" / "demo" / "deploy_key.pub").read_text()
    assert proc.stdout.startswith("ssh-ed25519 ")


def test_show_deploy_key_missing(project: tuple[Path, Path, subprocess.CompletedProcess[str]],
                                 tmp_path: Path) -> None:
    root, _, _ = project
    other_home = tmp_path / "elsewhere"
    proc = run_cli(root, "show-deploy-key", home=other_home)
    pub = other_home / "keys" / "demo" / "deploy_key.pub"
    assert_one_line_error(proc, f"no deploy key for project 'demo' at {pub}: 'higgsfield init demo' creates one; "
                                "for an existing project run 'higgsfield show-deploy-key --generate'")
    proc = run_cli(root, "show-deploy-key", "--generate", home=other_home)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == pub.read_text()
    assert mode(other_home / "keys" / "demo" / "deploy_key") == 0o600


def test_init_refuses_existing_directory(tmp_path: Path) -> None:
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "mine.txt").write_text("keep me")
    home = tmp_path / "home"
    proc = run_cli(tmp_path, "init", "demo", home=home)
    assert_one_line_error(proc, f"{tmp_path / 'demo'} already exists: choose another name or remove it first")
    assert tree(tmp_path / "demo") == {"mine.txt"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]
    assert not home.exists()


@pytest.mark.parametrize(("name", "quoted"), [
    ("1abc", "'1abc'"), ("my-proj", "'my-proj'"), ("a b", "'a b'"), ("../escape", "'../escape'"), ("x/y", "'x/y'"),
    ("", "''"), ("ünï", "'ünï'"), ("demo\n", "'demo\\n'"), ("a" * 65, "'" + "a" * 60 + "…' (65 chars)")])
def test_init_refuses_bad_names(tmp_path: Path, name: str, quoted: str) -> None:
    home = tmp_path / "home"
    work = tmp_path / "work"
    work.mkdir()
    proc = run_cli(work, "init", name, home=home)
    assert_one_line_error(proc, f"{quoted} is not a valid project name: use 1-64 letters, digits and _, "
                                "not starting with a digit (e.g. my_llama)")
    assert list(work.iterdir()) == [] and not (tmp_path / "escape").exists()
    assert not home.exists()


# -- the library, in process ----------------------------------------------------

def test_failure_midway_leaves_nothing(home: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*a: object, **k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(scaffold, "ensure_deploy_key", broken)
    with pytest.raises(ScaffoldError, match=r"^cannot create .*demo: No space left on device$"):
        scaffold.init_project("demo", workdir)
    assert list(workdir.iterdir()) == []


def test_failure_at_rename_removes_the_new_key(home: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(src: object, dst: object) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(scaffold.os, "rename", broken)
    with pytest.raises(ScaffoldError):
        scaffold.init_project("demo", workdir)
    assert list(workdir.iterdir()) == []
    assert not (home / "keys" / "demo").exists()


def test_interrupt_midway_leaves_nothing(home: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = scaffold._write
    calls = []

    def interrupted(path: Path, text: str, mode_: int | None, exclusive: bool = False) -> None:
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real(path, text, mode_, exclusive)

    monkeypatch.setattr(scaffold, "_write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        scaffold.init_project("demo", workdir)
    assert list(workdir.iterdir()) == []


def test_existing_key_is_reused_never_replaced(home: Path, workdir: Path) -> None:
    first = scaffold.init_project("demo", workdir)
    assert first.key is not None and first.key.created
    shutil.rmtree(workdir / "demo")
    (home / "keys" / "demo" / "deploy_key.pub").unlink()  # the public half is rebuilt from the private one
    second = scaffold.init_project("demo", workdir)
    assert second.key is not None and not second.key.created
    assert second.key.public_key == first.key.public_key
    assert scaffold.read_public_key("demo") == first.key.public_key


def test_unreadable_private_key_is_a_clear_error(home: Path) -> None:
    priv, _ = scaffold.deploy_key_paths("demo")
    priv.parent.mkdir(parents=True)
    priv.write_text("not a key")
    with pytest.raises(ScaffoldError, match="not a readable unencrypted OpenSSH private key"):
        scaffold.ensure_deploy_key("demo")


def test_config_home_is_read_at_call_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HIGGSFIELD_HOME_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert scaffold.deploy_key_paths("p")[0] == tmp_path / "xdg" / "higgsfield" / "keys" / "p" / "deploy_key"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert scaffold.config_home() == tmp_path / "h" / ".config" / "higgsfield"
    monkeypatch.setenv("HIGGSFIELD_HOME_CONFIG", str(tmp_path / "explicit"))
    assert scaffold.config_home() == tmp_path / "explicit"


def test_render_is_pure_and_complete(home: Path) -> None:
    texts = scaffold.render("my_llama")
    assert set(texts) == EXPECTED_FILES - {".higgsfield/higgsfield.schema.json"}
    assert "name: my_llama\n" in texts["higgsfield.yml"]
    assert not home.exists()
    with pytest.raises(ScaffoldError, match="not a valid project name"):
        scaffold.render("bad-name")


def test_init_via_click_runner(home: Path, workdir: Path) -> None:
    result = CliRunner().invoke(cli, ["init", "demo"], catch_exceptions=False)
    assert result.exit_code == 0
    assert (workdir / "demo" / "higgsfield.yml").is_file()
    result = CliRunner().invoke(cli, ["config", "schema"], catch_exceptions=False)
    assert result.exit_code == 0 and '"title": "higgsfield.yml"' in result.output


# -- imports stay lazy ----------------------------------------------------------

HELP_PROBE = """\
import sys
from higgsfield.control.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
heavy = [m for m in ("torch", "pydantic", "rich", "asyncssh", "yaml", "jinja2", "docker", "starlette", "uvicorn",
                     "higgsfield.control.ui") if m in sys.modules]
print("HEAVY", heavy)
"""


@pytest.mark.parametrize("argv", [["--help"], ["init", "--help"], ["config", "--help"], ["config", "check", "--help"],
                                  ["show-deploy-key", "--help"], ["--version"], ["ui", "--help"],
                                  ["metrics", "--help"]])
def test_help_imports_nothing_heavy(tmp_path: Path, argv: list[str]) -> None:
    code = HELP_PROBE.format(argv=argv)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=cli_env(tmp_path / "h"),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY []"


# -- the example experiment trains ----------------------------------------------

RUN_EXAMPLE = """\
import sys
sys.path.insert(0, "src")
import example  # noqa: F401
from higgsfield.experiment import registry
registry()["example"]({"steps": "40", "device": "cpu"})
"""


def _losses(output: str) -> list[float]:
    return [float(line.split()[-1]) for line in output.splitlines() if line.startswith("step")]


@pytest.mark.slow  # importing torch costs seconds of CPU
def test_example_experiment_loss_decreases(project: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    pytest.importorskip("torch")
    root, home, _ = project
    proc = subprocess.run([sys.executable, "-c", RUN_EXAMPLE], cwd=root, env=cli_env(home),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    losses = _losses(proc.stdout)
    assert len(losses) == 5  # steps 1, 10, 20, 30, 40
    assert all(a > b for a, b in zip(losses, losses[1:], strict=False)), losses
    assert losses[-1] < losses[0] / 10
    assert "done: 1 process(es) on cpu" in proc.stdout


@pytest.mark.slow
def test_example_experiment_under_torchrun_two_ranks(project: tuple[Path, Path, subprocess.CompletedProcess[str]],
                                                     tmp_path: Path) -> None:
    pytest.importorskip("torch")
    root, home, _ = project
    script = tmp_path / "run_example.py"
    # Run by hand under torchrun (no higgsfield.node.entrypoint), a rank ends the way the entrypoint ends it:
    # entrypoint.leave skips interpreter finalization, where gloo's threads abort a finished rank.
    script.write_text(RUN_EXAMPLE.replace('"src"', repr(str(root / "src")))
                      + "from higgsfield.node.entrypoint import leave\nleave(0)\n")
    env = cli_env(home, OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", str(script)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = _losses(proc.stdout)
    assert len(losses) == 5 and losses[-1] < losses[0] / 10, proc.stdout
    assert "done: 2 process(es) on cpu" in proc.stdout

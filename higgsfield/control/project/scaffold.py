"""``higgsfield init``: scaffold a project and its deploy key; no CLI, no printing.

A project is written whole or not at all: every file is rendered into a hidden
directory beside the target, which is renamed into place only at the end; on any
failure the directory (and a deploy key made for it) is removed. Templates are
``templates/scaffold/*.j2``, shipped as the package ``higgsfield.templates``.

The deploy key lives outside the project, so it can never be committed::

    $HIGGSFIELD_HOME_CONFIG/keys/<project>/deploy_key{,.pub}
    (default: ${XDG_CONFIG_HOME:-~/.config}/higgsfield/keys/<project>/)

with the directory 0700 and the private key 0600. The environment is read when a
function is called, never at import, so tests can point it at a temporary home.

Use::

    result = init_project("my_llama", Path.cwd())
    result.project_dir, result.key.public_key
    print(read_public_key("my_llama"))
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

from higgsfield import __version__
from higgsfield.contract.errors import ScaffoldError
from higgsfield.contract.stall_policy import DEFAULT_STALL, ON_STALL_CHOICES

TEMPLATE_PACKAGE = "higgsfield.templates"
#: Project file -> template under templates/scaffold/.
FILES: dict[str, str] = {
    "higgsfield.yml": "higgsfield.yml.j2",
    "src/example.py": "example.py.j2",
    "Dockerfile": "Dockerfile.j2",
    "requirements.txt": "requirements.txt.j2",
    ".gitignore": "gitignore.j2",
    ".dockerignore": "dockerignore.j2",
    "env": "env.j2",
    "README.md": "README.md.j2",
}
#: Files only their owner may read.
PRIVATE_FILES = frozenset({"env"})
SCHEMA_FILE = ".higgsfield/higgsfield.schema.json"
KEY_NAME = "deploy_key"


@dataclass(frozen=True)
class DeployKey:
    """An ed25519 key pair in the user's config directory."""

    private_path: Path
    public_path: Path
    public_key: str          # one line: "ssh-ed25519 AAAA... comment"
    created: bool            # False when an existing pair was reused


@dataclass(frozen=True)
class ScaffoldResult:
    project_dir: Path
    files: list[str] = field(default_factory=list)   # relative paths, in creation order
    key: DeployKey | None = None


# -- locations ----------------------------------------------------------------

def config_home() -> Path:
    """higgsfield's per-user config directory (keys live here, not in projects)."""
    explicit = os.environ.get("HIGGSFIELD_HOME_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
    return base / "higgsfield"


def key_dir(project: str) -> Path:
    return config_home() / "keys" / check_project_name(project)


def deploy_key_paths(project: str) -> tuple[Path, Path]:
    """(private, public) paths of ``project``'s deploy key."""
    d = key_dir(project)
    return d / KEY_NAME, d / f"{KEY_NAME}.pub"


def check_project_name(name: str) -> str:
    from higgsfield.contract.names import MAX_NAME, NAME_RE
    from higgsfield.contract.text import shown

    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or len(name) > MAX_NAME:
        raise ScaffoldError(f"{shown(name)} is not a valid project name: use 1-{MAX_NAME} letters, digits and _, "
                            "not starting with a digit (e.g. my_llama)")
    return name


# -- rendering ----------------------------------------------------------------

def render(name: str) -> dict[str, str]:
    """The text of every scaffold file for project ``name`` (pure: touches no disk but templates)."""
    import jinja2

    check_project_name(name)
    root = files(TEMPLATE_PACKAGE).joinpath("scaffold")

    def load(template: str) -> str:
        try:
            return root.joinpath(template).read_text(encoding="utf-8")
        except (FileNotFoundError, OSError) as e:
            raise ScaffoldError(f"template {template} is missing from {TEMPLATE_PACKAGE}: {e}; "
                                "reinstall higgsfield") from None

    env = jinja2.Environment(loader=jinja2.FunctionLoader(load), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False)
    context = {"name": name, "version": __version__, "key_dir": _display(key_dir(name)),
               "stall": DEFAULT_STALL, "on_stall_choices": ON_STALL_CHOICES}   # the defaults, written once
    return {path: env.get_template(template).render(context) for path, template in FILES.items()}


def _display(p: Path) -> str:
    """``p`` with the home directory shown as ~ (for text the user reads)."""
    try:
        return "~/" + str(p.relative_to(Path.home()))
    except ValueError:
        return str(p)


# -- the deploy key -----------------------------------------------------------

def ensure_deploy_key(project: str) -> DeployKey:
    """The project's deploy key pair: reused when the private key exists, else generated.

    An existing key is never replaced: its public half may already be registered
    with GitHub or on the nodes.
    """
    priv, pub = deploy_key_paths(project)
    _make_private_dir(priv.parent)
    if priv.exists():
        public = _public_from_private(priv, project)
        if not pub.exists() or pub.read_text().strip() != public:
            _write(pub, public + "\n", 0o644)
        return DeployKey(priv, pub, public, created=False)
    private_pem, public = _generate(f"higgsfield deploy key: {project}")
    try:
        _write(priv, private_pem, 0o600, exclusive=True)
        _write(pub, public + "\n", 0o644)
    except FileExistsError:  # another init raced us: use its key
        return ensure_deploy_key(project)
    except BaseException:
        _unlink(priv)
        _unlink(pub)
        raise
    return DeployKey(priv, pub, public, created=True)


def read_public_key(project: str) -> str:
    """The public half of ``project``'s deploy key; ScaffoldError saying how to make one if missing."""
    priv, pub = deploy_key_paths(project)
    if pub.is_file():
        return pub.read_text().strip()
    if priv.is_file():
        return _public_from_private(priv, project)
    raise ScaffoldError(f"no deploy key for project '{project}' at {pub}: 'higgsfield init {project}' creates "
                        "one; for an existing project run 'higgsfield show-deploy-key --generate'")


def remove_deploy_key(key: DeployKey) -> None:
    _unlink(key.private_path)
    _unlink(key.public_path)
    try:
        key.private_path.parent.rmdir()  # only when nothing else is in it
    except OSError:
        pass


def _generate(comment: str) -> tuple[str, str]:
    # cryptography is what asyncssh itself builds on, and imports in a tenth of the time.
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                    serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    return private_pem, f"{public} {comment}"


def _public_from_private(priv: Path, project: str) -> str:
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_ssh_private_key(priv.read_bytes(), password=None)
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                               serialization.PublicFormat.OpenSSH).decode()
    except (ValueError, TypeError, OSError) as e:
        raise ScaffoldError(f"{priv}: not a readable unencrypted OpenSSH private key ({e}); "
                            "move it away and run 'higgsfield show-deploy-key --generate'") from None
    return f"{public} higgsfield deploy key: {project}"


def _make_private_dir(d: Path) -> None:
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(d, 0o700)
        os.chmod(d.parent, 0o700)  # keys/
    except OSError as e:
        raise ScaffoldError(f"cannot create the key directory {d}: {e.strerror}") from None


# -- the project --------------------------------------------------------------

def init_project(name: str, parent: Path | None = None) -> ScaffoldResult:
    """Create ``parent/name`` (default: the working directory) with every scaffold file and a deploy key."""
    check_project_name(name)
    parent = Path(parent) if parent is not None else Path.cwd()
    target = parent / name
    if target.exists() or target.is_symlink():
        raise ScaffoldError(f"{target} already exists: choose another name or remove it first")
    if not parent.is_dir():
        raise ScaffoldError(f"{parent} is not a directory")
    texts = render(name)
    _self_check(texts["higgsfield.yml"], target / "higgsfield.yml")
    tmp = parent / f".{name}.higgsfield-init-{secrets.token_hex(4)}"
    key: DeployKey | None = None
    try:
        os.mkdir(tmp)
        written = _write_tree(tmp, texts)
        key = ensure_deploy_key(name)
        if target.exists() or target.is_symlink():
            raise ScaffoldError(f"{target} already exists: choose another name or remove it first")
        os.rename(tmp, target)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if key is not None and key.created:
            remove_deploy_key(key)
        if isinstance(e, OSError):
            raise ScaffoldError(f"cannot create {target}: {e.strerror or e}") from None
        raise
    return ScaffoldResult(project_dir=target, files=written, key=key)


def _write_tree(root: Path, texts: dict[str, str]) -> list[str]:
    from higgsfield.control.config import json_schema

    written = []
    for rel, text in texts.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, text, 0o600 if rel in PRIVATE_FILES else None)
        written.append(rel)
    schema = root / SCHEMA_FILE
    schema.parent.mkdir(parents=True, exist_ok=True)
    _write(schema, json.dumps(json_schema(), indent=2) + "\n", None)
    written.append(SCHEMA_FILE)
    return written


def _self_check(text: str, path: Path) -> None:
    """Refuse to write a config that ``higgsfield config check`` would reject (a template bug)."""
    from higgsfield.contract.errors import ConfigError
    from higgsfield.control.config import parse_config

    try:
        parse_config(text, path)
    except ConfigError as e:
        raise ScaffoldError(f"the scaffold template is broken ({e}); please report this") from None


def _write(path: Path, text: str, mode: int | None, exclusive: bool = False) -> None:
    """Write ``text``; with ``mode`` the file is created with it (never briefly wider)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, 0o666 if mode is None else mode)
    if mode is not None:
        os.fchmod(fd, mode)  # an existing file keeps its mode through O_TRUNC otherwise
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def _unlink(p: Path) -> None:
    try:
        p.unlink()
    except FileNotFoundError:
        pass

"""The typed model of ``higgsfield.yml`` and its loader.

Every field is typed and documented; unknown keys are refused. Any problem is
reported as one :class:`~higgsfield.errors.ConfigError` line naming the file, the
line and the field, for example::

    higgsfield.yml:7: nodes[1].port: must be between 1 and 65535 (got 70000)

Use::

    cfg = load_config()              # ./higgsfield.yml, or the nearest one above
    cfg.nodes[0].host, cfg.project_dir
"""

from __future__ import annotations

import getpass
import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from higgsfield import __version__
from higgsfield.errors import ConfigError
from higgsfield.names import (
    LOCAL_HOSTS,
    MAX_NAME,
    NAME_RE,
    SECRET_RE,
    check_host,
    check_node_name,
    check_secret_name,
    check_text,
    check_user,
)
from higgsfield.text import shown

__all__ = ["CONFIG_FILE", "LOCAL_HOSTS", "NAME_RE", "SECRET_RE", "Config", "NodeConfig", "SSHConfig",
           "find_config", "json_schema", "load_config", "parse_config"]

CONFIG_FILE = "higgsfield.yml"
BRANCH_RE = re.compile(r"\A[A-Za-z0-9._/-]{1,200}\Z")
#: A config is a few KB; anything this big is the wrong file (and would take PyYAML seconds).
MAX_CONFIG_BYTES = 256 * 1024
#: YAML nodes visited, aliases expanded, before a config is called an alias bomb.
MAX_YAML_NODES = 100_000


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)


def _no_bool(v: Any) -> Any:
    # pydantic's lax mode reads YAML's true/false as 1/0; a number field never means a bool.
    if isinstance(v, bool):
        raise ValueError(f"expected a number, not {str(v).lower()}")
    return v


def _nproc(v: Any) -> Any:
    # One check (and one message) instead of pydantic's two union-branch errors.
    if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
        return v
    raise ValueError(f"must be 'auto' or an integer >= 1 (got {shown(v)})")


Int = Annotated[int, BeforeValidator(_no_bool)]
Float = Annotated[float, Field(allow_inf_nan=False), BeforeValidator(_no_bool)]   # .inf would overflow a timer
Port = Annotated[int, Field(ge=1, le=65535), BeforeValidator(_no_bool)]
# Constraints sit inside the Annotated so the JSON Schema says minimum/maximum inside anyOf.
Nproc = Annotated[Annotated[int, Field(ge=1)] | Literal["auto"], BeforeValidator(_nproc)]


def _refuse_root(user: str | None) -> str | None:
    return None if user is None else check_user(user)


def _checked(*fields: str, check: Callable[[Any], Any]) -> Any:
    """A field validator running ``check`` on each set value (None, the default, is left alone)."""
    return field_validator(*fields)(classmethod(lambda cls, v: v if v is None else check(v)))


def _state_dir(v: str) -> str:
    check_text(v)
    parts = PurePosixPath(v).parts
    if v.startswith("-"):
        raise ValueError(f"{shown(v)} starts with '-'")
    if ".." in parts:
        raise ValueError(f"{shown(v)} contains '..': name the directory itself")
    if len(parts) <= 1 and (not parts or parts[0] in ("/", ".") or parts[0].startswith("~")):
        raise ValueError(f"{shown(v)} is the root or a home directory itself: higgsfield needs a "
                         "directory of its own there, e.g. ~/.higgsfield")
    return v


def _pip_source(v: str) -> str:
    check_text(v)
    if v.startswith("-"):
        raise ValueError(f"{shown(v)} starts with '-', which pip would read as an option: give a requirement, "
                         "a git+https:// URL or a path")
    return v


def _index_url(v: str) -> str:
    check_text(v)
    if not re.fullmatch(r"https?://\S+", v):
        raise ValueError(f"{shown(v)} is not an http(s):// URL")
    return v


class SSHConfig(_Model):
    """How to reach the nodes over SSH (each field can be overridden per node)."""

    user: str | None = Field(None, description="Login user on the nodes; default: your local user name. Never root.")
    port: Port = Field(22, description="SSH port.")
    identity_file: str | None = Field(None, description="Private key file; default: ssh-agent and ~/.ssh/id_*.")
    known_hosts: str = Field(".higgsfield/known_hosts",
                             description="Pinned host keys, relative to the project; pinned on first contact.")
    connect_timeout: Float = Field(10.0, gt=0, description="Seconds to connect and authenticate.")
    command_timeout: Float = Field(900.0, gt=0, description="Seconds one remote command may run.")
    retries: Int = Field(2, ge=0, le=10, description="Connection retries (with backoff); commands are never retried.")

    _user = field_validator("user")(classmethod(lambda cls, v: _refuse_root(v)))
    _paths = _checked("identity_file", "known_hosts", check=check_text)


class NodeConfig(_Model):
    """One node. Its position in ``nodes`` is its node rank; the first is the master."""

    host: str = Field(..., min_length=1, description="Host name or address; 'localhost' runs without SSH.")
    name: str | None = Field(None, description="Display name; default: the host (and port when not 22).")
    port: Port | None = Field(None, description="Overrides ssh.port.")
    user: str | None = Field(None, description="Overrides ssh.user.")
    identity_file: str | None = Field(None, description="Overrides ssh.identity_file.")
    nproc_per_node: Nproc | None = Field(None, description="Overrides nproc_per_node.")

    _user = field_validator("user")(classmethod(lambda cls, v: _refuse_root(v)))
    _host = _checked("host", check=check_host)
    _name = _checked("name", check=check_node_name)
    _identity = _checked("identity_file", check=check_text)

    @property
    def is_local(self) -> bool:
        return self.host.lower() in LOCAL_HOSTS


class DockerConfig(_Model):
    """The training image built on every node."""

    dockerfile: str = Field("Dockerfile", description="Dockerfile, relative to the project.")
    base_image: str | None = Field(None, description="Passed as the BASE_IMAGE build argument when set.")

    _text = _checked("dockerfile", "base_image", check=check_text)


class InstallConfig(_Model):
    """How GitHub Actions jobs install higgsfield (the version that generated them)."""

    source: str = Field(f"higgsfield=={__version__}",
                        description="A pip requirement: 'higgsfield==X', 'git+https://...', a wheel URL.")
    index_url: str | None = Field(None, description="Extra pip index for private installs.")

    _source = _checked("source", check=_pip_source)
    _index = _checked("index_url", check=_index_url)


class Config(_Model):
    """Everything in ``higgsfield.yml``."""

    name: str = Field(..., description="Project name: ^[a-zA-Z_][a-zA-Z0-9_]*$")
    nodes: list[NodeConfig] = Field(..., description="The nodes, in node-rank order; the first is the master.")
    ssh: SSHConfig = Field(default_factory=SSHConfig)  # type: ignore[arg-type]
    nproc_per_node: Nproc = Field(
        "auto", description="Processes per node: 'auto' = the node's GPU count (1 without GPUs).")
    runtime: Literal["auto", "docker", "process"] = Field(
        "auto", description="How runs start on a node: docker when available ('auto'), or plain processes.")
    secrets: list[str] = Field(default_factory=list,
                               description="Names of secrets; values come from the env file or CI secrets.")
    state_dir: str = Field("~/.higgsfield", description="Where the invoker keeps code, runs and logs on a node.")
    docker: DockerConfig = Field(default_factory=DockerConfig)  # type: ignore[arg-type]
    install: InstallConfig = Field(default_factory=InstallConfig)  # type: ignore[arg-type]
    default_branch: str = Field("main", description="Pushes to this branch deploy (GitHub Actions).")

    path: Path | None = Field(None, exclude=True, description="Where this config was read from (not a YAML key).")

    _state = _checked("state_dir", check=_state_dir)

    @field_validator("default_branch")
    @classmethod
    def _default_branch(cls, v: str) -> str:
        # It is written into the generated workflows (on.push.branches): a git branch name, nothing else.
        if (not BRANCH_RE.fullmatch(v) or ".." in v or v.startswith(("-", "/")) or v.endswith(("/", ".", ".lock"))
                or "//" in v or "/." in v or v.startswith(".")):
            raise ValueError(f"{shown(v)} is not a valid git branch name: use letters, digits and . _ / - "
                             "(no '..', not starting with '-', '/' or '.')")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):
            raise ValueError(f"{shown(v)} is not a valid name: use letters, digits and _, not starting with a digit")
        if len(v) > MAX_NAME:
            raise ValueError(f"{shown(v)} is too long: a project name has at most {MAX_NAME} characters")
        return v

    @field_validator("secrets")
    @classmethod
    def _secrets(cls, v: list[str]) -> list[str]:
        for s in v:
            check_secret_name(s)
        if len(set(v)) != len(v):
            raise ValueError("a secret is listed twice")
        return v

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: list[NodeConfig]) -> list[NodeConfig]:
        if not v:
            raise ValueError("list at least one node")
        return v

    @model_validator(mode="after")
    def _unique_nodes(self) -> Config:
        # Two entries for one login on one machine would share one state directory, so one run
        # directory: the same host in another case, 'localhost' and 'local', the same name twice.
        names: dict[str, int] = {}
        logins: dict[tuple[str, int, str | None], int] = {}
        for i, node in enumerate(self.nodes):
            port = self.node_port(node)
            if node.name is None:
                node.name = node.host if port == 22 or node.is_local else f"{node.host}:{port}"
            key = node.name.lower()
            if key in names:
                raise _NodeDup(i, f"node {shown(node.name)} is listed twice (also nodes[{names[key]}]); "
                                  "give each node a distinct host, port or name")
            names[key] = i
            login = ("localhost", 0, None) if node.is_local else \
                (node.host.lower().rstrip("."), port, node.user or self.ssh.user)
            if login in logins:
                what = "this machine" if node.is_local else f"{node.host} port {port}"
                raise _NodeDup(i, f"node {shown(node.name)} is {what} again (also nodes[{logins[login]}]): two "
                                  "nodes for one login would share one state directory; list each machine once")
            logins[login] = i
        return self

    # -- derived values -------------------------------------------------------

    @property
    def project_dir(self) -> Path:
        return self.path.parent if self.path else Path.cwd()

    @property
    def known_hosts_path(self) -> Path:
        p = Path(self.ssh.known_hosts).expanduser()
        return p if p.is_absolute() else self.project_dir / p

    @property
    def env_file(self) -> Path:
        return self.project_dir / "env"

    def node_port(self, node: NodeConfig) -> int:
        return node.port or self.ssh.port

    def node_user(self, node: NodeConfig) -> str:
        """The login user: the node's, else ssh.user, else the local user name (never root)."""
        user = node.user or self.ssh.user
        if user:
            return user
        local = getpass.getuser()
        if local == "root":
            raise ConfigError(f"{self.path or CONFIG_FILE}: node '{node.name}': no ssh.user is set and your local "
                              "user is root, which nodes refuse; set ssh.user to a non-root user with sudo")
        return local

    def node_identity(self, node: NodeConfig) -> str | None:
        ident = node.identity_file or self.ssh.identity_file
        return str(Path(ident).expanduser()) if ident else None

    def node_nproc(self, node: NodeConfig) -> int | Literal["auto"]:
        return node.nproc_per_node or self.nproc_per_node

    def node(self, name: str) -> NodeConfig:
        for n in self.nodes:
            if n.name == name or n.host == name:
                return n
        known = ", ".join(str(n.name) for n in self.nodes)
        raise ConfigError(f"{self.path or CONFIG_FILE}: no node named {shown(name)} (nodes: {known})")


class _NodeDup(ValueError):
    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


# -- loading ------------------------------------------------------------------

def find_config(start: Path | None = None) -> Path:
    """The nearest ``higgsfield.yml`` at or above ``start`` (default: the working directory)."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        candidate = d / CONFIG_FILE
        if candidate.is_file():
            return candidate
    raise ConfigError(f"no {CONFIG_FILE} in {here} or above: run 'higgsfield init NAME' to create a project, "
                      "or pass --config")


def load_config(path: Path | str | None = None) -> Config:
    """Read, validate and return the config; raises ConfigError with file:line: field: message."""
    p = Path(path) if path else find_config()
    return parse_config(read_config_text(p), p)


def read_config_text(p: Path) -> str:
    """The text of the config file: a regular file, at most MAX_CONFIG_BYTES, UTF-8, not binary."""
    try:
        if not p.is_file():
            # A FIFO or /dev/zero would block or never end; a directory cannot be read.
            raise ConfigError(f"{p}: file not found" if not p.exists() else f"{p}: not a regular file")
        with open(p, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{p}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: larger than {MAX_CONFIG_BYTES // 1024} KiB; a higgsfield.yml is a few KB, "
                          "is this the right file?")
    return decode_text(data, p, "YAML")


def decode_text(data: bytes, p: Path, kind: str) -> str:
    """``data`` as UTF-8 text (a BOM is dropped); ConfigError naming the line of a bad byte or a NUL."""
    if b"\x00" in data:
        line = data[:data.index(b"\x00")].count(b"\n") + 1
        raise ConfigError(f"{p}:{line}: a NUL byte: this is a binary file, not {kind} text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ConfigError(f"{p}:{line}: byte 0x{data[e.start]:02x} is not UTF-8: save the file as UTF-8 "
                          f"{kind} text") from None


def parse_config(text: str, path: Path) -> Config:
    """Validate the config ``text`` read from ``path``; every problem is one ConfigError line."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // 1024} KiB; a higgsfield.yml is a few KB")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        _check_keys(root, path)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f":{mark.line + 1}" if mark else ""
        what = e.problem or e.context
        if e.problem and e.context and e.problem.startswith("but "):  # "expected X ... but found Y"
            what = f"{e.context}, {e.problem}"
        raise ConfigError(f"{path}{line}: invalid YAML: {what}") from None
    except yaml.reader.ReaderError as e:
        at = text[:e.position].count("\n") + 1
        char = e.character if isinstance(e.character, str) else chr(e.character)
        raise ConfigError(f"{path}:{at}: invalid YAML: character U+{ord(char):04X} is not allowed in YAML "
                          "text") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid YAML: nested too deeply") from None
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - PyYAML's constructors on a tagged value: ValueError (an int of
        # 5000 digits, 2020-13-45), AttributeError ('!!timestamp x'), TypeError...: all mean "cannot be read".
        raise ConfigError(f"{path}: invalid YAML: a value cannot be read ({shown(str(e))})") from None
    if data is None:
        raise ConfigError(f"{path}: the file is empty; it needs at least 'name' and 'nodes'")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: the top level must be a mapping of keys (name, nodes, ...)")
    try:
        cfg = Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_validation(e, root, path)) from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    cfg.path = path.resolve()
    return cfg


_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"


def _check_keys(root: yaml.Node | None, path: Path) -> None:
    """Keys are names, each once per mapping; an alias bomb is refused before anything expands it.

    The walk follows aliases as the loader will (that is where a bomb's cost is), but
    counts every node it visits and stops at MAX_YAML_NODES: a config is a few hundred.
    """
    stack: list[yaml.Node] = [root] if root is not None else []
    visited = 0
    while stack:
        node = stack.pop()
        visited += 1
        if visited > MAX_YAML_NODES:
            raise ConfigError(f"{path}:{node.start_mark.line + 1}: invalid YAML: anchors and aliases expand to more "
                              f"than {MAX_YAML_NODES} values; write the values out (an alias bomb?)")
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            values = []
            for k, v in node.value:
                if not isinstance(k, yaml.ScalarNode):
                    raise ConfigError(f"{path}:{k.start_mark.line + 1}: a key must be a name, not a list or mapping")
                if k.tag not in (_STR_TAG, _MERGE_TAG):
                    raise ConfigError(f"{path}:{k.start_mark.line + 1}: key {shown(k.value)} must be a name, "
                                      "not a number or bool")
                if k.value in seen:
                    raise ConfigError(f"{path}:{k.start_mark.line + 1}: key {shown(k.value)} appears twice")
                seen.add(k.value)
                values.append(v)
            stack.extend(reversed(values))   # in document order, so the first problem is the one reported
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(reversed(node.value))


def _line_of(root: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of the YAML node at ``loc`` (or of its nearest existing parent)."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        nxt = None
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for k, v in node.value:
                if k.value == part:
                    line = k.start_mark.line + 1
                    nxt = v
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            nxt = node.value[part]
            line = nxt.start_mark.line + 1
        if nxt is None:
            break
        node = nxt
    return line


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


_FRIENDLY = {
    "int_parsing": "expected an integer",
    "int_type": "expected an integer",
    "int_from_float": "expected an integer",
    "float_parsing": "expected a number",
    "float_type": "expected a number",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "model_type": "expected a mapping of keys",
    "dict_type": "expected a mapping of keys",
    "bool_parsing": "expected true or false",
}


def _format_validation(err: ValidationError, root: yaml.Node | None, path: Path) -> str:
    e = err.errors()[0]
    loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p in ("int", "literal['auto']",
                                                                         "function-after[_positive(), int]")))
    kind = e["type"]
    ctx_err = (e.get("ctx") or {}).get("error")
    if isinstance(ctx_err, _NodeDup):
        loc = ("nodes", ctx_err.index)
    given = e.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        msg = f"unknown key {shown(loc[-1])}" + (f" (allowed: {', '.join(allowed)})" if allowed else "")
    elif kind == "missing":
        msg = "is required"
    elif kind in ("greater_than_equal", "less_than_equal") and loc and loc[-1] == "port":
        msg = f"must be between 1 and 65535 (got {shown(given)})"
    elif kind in _FRIENDLY:
        msg = f"{_FRIENDLY[kind]} (got {shown(given)})"
    elif kind == "literal_error":
        msg = f"must be {e['ctx']['expected']} (got {shown(given)})"
    elif kind == "too_short" and loc == ("nodes",):
        msg = "list at least one node"
    elif kind == "value_error":
        msg = str(ctx_err) if ctx_err else e["msg"]
    else:
        msg = e["msg"][0].lower() + e["msg"][1:]
        if given is not None and not isinstance(given, (dict, list)):
            msg += f" (got {shown(given)})"
    line = _line_of(root, loc)
    where = f"{path}:{line}" if line else str(path)
    field = _field_path(loc)
    more = len(err.errors()) - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{where}: {field + ': ' if field else ''}{msg}{tail}"


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = Config
    for part in loc:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part)
        ann = getattr(info, "annotation", None)
        inner = getattr(ann, "__args__", (ann,))
        for cand in (ann, *inner):
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                model = cand
                break
        else:
            return []
    return [k for k in model.model_fields if k != "path"]


def json_schema() -> dict[str, Any]:
    """The JSON Schema of higgsfield.yml, for editors (yaml-language-server)."""
    schema = Config.model_json_schema(mode="validation")
    schema.get("properties", {}).pop("path", None)
    schema["title"] = "higgsfield.yml"
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema

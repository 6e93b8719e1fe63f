"""The typed model of ``higgsfield.yml``: every field typed, documented and checked.

Unknown keys are refused, and a field's validator says in words what is wrong with a
value; :mod:`higgsfield.control.config.loader` turns that into one line naming the file, the
line and the field. The derived values (a node's port, user, identity file) live on
:class:`Config` so no caller repeats the "node's, else ssh's, else the default" rule.

Use::

    cfg = Config.model_validate({"name": "demo", "nodes": [{"host": "gpu-1"}]})
    cfg.node_port(cfg.nodes[0])      # 22

The JSON Schema that editors complete from, and every error's field path, come from these
classes together; the ``slurm:`` block (the model the Slurm backend runs with) is
:mod:`higgsfield.control.config.slurm`, the smaller blocks (docker, install, retention,
checkpoint, notify) :mod:`higgsfield.control.config.blocks`, and the field types all blocks
share are :mod:`higgsfield.control.config.fields`.
"""

from __future__ import annotations

import getpass
import re
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from higgsfield.contract.errors import ConfigError
from higgsfield.contract.layout import DEFAULT_STATE_DIR
from higgsfield.contract.names import (
    LOCAL_HOSTS,
    MAX_NAME,
    NAME_RE,
    check_host,
    check_node_name,
    check_secret_name,
    check_text,
)
from higgsfield.contract.runspec import DEFAULT_MAX_RECOVERIES
from higgsfield.contract.stall_policy import DEFAULT_STALL
from higgsfield.contract.straggler import OnStraggler
from higgsfield.contract.text import shown
from higgsfield.control.config.blocks import (
    CheckpointConfig,
    DataEntry,
    DockerConfig,
    InstallConfig,
    NotifyConfig,
    RetentionConfig,
    check_data,
)
from higgsfield.control.config.fields import Float, Int, Misplaced, OnStallChoice, Port
from higgsfield.control.config.fields import Model as _Model
from higgsfield.control.config.fields import checked as _checked
from higgsfield.control.config.fields import refuse_root as _refuse_root
from higgsfield.control.config.slurm import LoginConfig, SlurmConfig

__all__ = ["CONFIG_FILE", "Config", "DockerConfig", "InstallConfig", "LoginConfig", "NodeConfig", "NodeDup",
           "CheckpointConfig", "NotifyConfig", "RetentionConfig", "SSHConfig", "SlurmConfig", "json_schema"]

CONFIG_FILE = "higgsfield.yml"
BRANCH_RE = re.compile(r"\A[A-Za-z0-9._/-]{1,200}\Z")


def _nproc(v: Any) -> Any:
    # One check (and one message) instead of pydantic's two union-branch errors.
    if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
        return v
    raise ValueError(f"must be 'auto' or an integer >= 1 (got {shown(v)})")


# Constraints sit inside the Annotated so the JSON Schema says minimum/maximum inside anyOf.
Nproc = Annotated[Annotated[int, Field(ge=1)] | Literal["auto"], BeforeValidator(_nproc)]


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


class Config(_Model):
    """Everything in ``higgsfield.yml``."""

    name: str = Field(..., description="Project name: ^[a-zA-Z_][a-zA-Z0-9_]*$")
    # Before `nodes`: the nodes' check reads it (a project on a Slurm cluster lists no nodes).
    slurm: SlurmConfig | None = Field(None, description="A Slurm cluster to run on instead of the SSH nodes.")
    nodes: list[NodeConfig] = Field(default_factory=list, validate_default=True,
                                    description="The nodes, in node-rank order; the first is the master "
                                                "(not used with a slurm block).")
    ssh: SSHConfig = Field(default_factory=SSHConfig)  # type: ignore[arg-type]
    nproc_per_node: Nproc = Field(
        "auto", description="Processes per node: 'auto' = the node's GPU count (1 without GPUs).")
    runtime: Literal["auto", "docker", "process"] = Field(
        "auto", description="How runs start on a node: docker when available ('auto'), or plain processes.")
    secrets: list[str] = Field(default_factory=list,
                               description="Names of secrets; values come from the env file or CI secrets.")
    state_dir: str = Field(DEFAULT_STATE_DIR, description="Where the invoker keeps code, runs and logs on a node.")
    docker: DockerConfig = Field(default_factory=DockerConfig)  # type: ignore[arg-type]
    install: InstallConfig = Field(default_factory=InstallConfig)  # type: ignore[arg-type]
    default_branch: str = Field("main", description="Pushes to this branch deploy (GitHub Actions).")
    retention: RetentionConfig | None = Field(
        None, description="Remove old finished runs (and unused images) from the nodes; deploy applies it.")

    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)  # type: ignore[arg-type]
    notify: NotifyConfig | None = Field(None, description="Send a run's events (failed, succeeded, stalled...) to "
                                                          "Slack, Discord, e-mail or a webhook, from its node 0.")

    # The stall watchdog (issue 18): the node side finds a run that hangs, laptop or not.
    stall_timeout: Float = Field(
        DEFAULT_STALL.stall_timeout, ge=0, description="Seconds without progress of any rank (steps reported through "
                                 "higgsfield.training.progress, else new output lines) after which a run is "
                                 "stalled; 0 turns the watchdog off. --stall-timeout per run.")
    startup_timeout: Float = Field(
        DEFAULT_STALL.startup_timeout, ge=0, description="Seconds a run may take to its first progress (loading weights, compiling); "
                                  "0: no limit. --startup-timeout per run.")
    on_stall: OnStallChoice = Field(
        DEFAULT_STALL.on_stall, title="On Stall", description="What a stalled run does: fail (stop it everywhere, free its GPUs), restart (its "
                            "workers, from the last checkpoint, counted against --max-restarts) or wait (shown "
                            "'stalled' until it progresses again). --on-stall per run.")
    on_straggler: OnStraggler = Field(
        OnStraggler.WARN, title="On Straggler", description="What a run does when a rank's own work per step stays well "
                             "above the other ranks' median (higgsfield.node.gang.stragglers): warn (name it in "
                             "status, on the dashboard and as the 'straggler' notify event; the run goes on) or "
                             "replace (name it, and when a spare stands by, go on without its node from the last "
                             "checkpoint, as if it were lost: run --spares N).")

    # Recovery from a lost node (issue 30): the nodes regroup by themselves, laptop or not. The flags of
    # run (--min-nodes, --spares, --max-recoveries) win; ci run and the dashboard's runs use these.
    min_nodes: Int | None = Field(
        None, ge=1, description="The fewest nodes a run goes on on after losing some (dead, frozen, cut off): "
                                "the others regroup and resume from the last checkpoint. Default: every node "
                                "(a loss fails the run). --min-nodes per run.")
    spares: Int = Field(
        0, ge=0, description="Nodes listed after the run's that stand by, holding their slots, to take a lost "
                             "node's place (at most as many as --nodes K leaves). --spares per run.")
    max_recoveries: Int = Field(
        DEFAULT_MAX_RECOVERIES, ge=0, le=1000, description="Lost nodes a run goes on after (with min_nodes or "
                                                           "spares); 0 turns recovery off. --max-recoveries per run.")

    preflight: bool = Field(
        False, description="Test the fabric before every run (doctor --fabric): a slow or failing node is "
                           "passed over when --nodes K leaves spares. --preflight per run.")

    data: dict[str, DataEntry] = Field(
        default_factory=dict, description="Named data and weights every node gets (higgsfield data push): "
                                          "name -> a source (a path, an fsspec URL, hf://org/repo), or "
                                          "{source, revision}. A run reads params.data[NAME] (read-only).")

    path: Path | None = Field(None, exclude=True, description="Where this config was read from (not a YAML key).")

    _state = _checked("state_dir", check=_state_dir)
    _data = field_validator("data")(classmethod(lambda cls, v: check_data(v)))

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

    @field_validator("preflight")
    @classmethod
    def _preflight(cls, v: bool, info: ValidationInfo) -> bool:
        # said here, once, rather than by every command that would run it (run, ci run)
        if v and info.data.get("slurm") is not None:
            raise ValueError("true is for SSH nodes: on a Slurm cluster the allocation picks the nodes (doctor "
                             "--fabric tests the partition, run --exclude keeps a node out); remove it")
        return v

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: list[NodeConfig], info: ValidationInfo) -> list[NodeConfig]:
        # "slurm" missing from data: the block is there but wrong, and that is the one error to report
        if not v and "slurm" in info.data and info.data["slurm"] is None:
            raise ValueError("list at least one node (or describe a Slurm cluster in a slurm block)")
        return v

    @model_validator(mode="after")
    def _recovery(self) -> Config:
        # against the nodes listed; a Slurm run's size is its --nodes, which plan() compares with
        listed = len(self.nodes)
        if self.min_nodes is not None and listed and self.min_nodes > listed:
            raise Misplaced(("min_nodes",), f"{self.min_nodes} is more than the run's {listed} node(s): give 1 to "
                                            f"{listed}, the fewest a run may go on on after losing some")
        if self.spares and self.slurm is not None:
            raise Misplaced(("spares",), "spares are for SSH nodes: on a Slurm cluster the partition's free nodes "
                                         "stand in for a lost one (min_nodes, max_recoveries); remove it")
        if self.spares and listed and self.spares >= listed:
            raise Misplaced(("spares",), f"{self.spares} leaves no node of the {listed} listed to run on: give 0 "
                                         f"to {listed - 1}")
        return self

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
                raise NodeDup(i, f"node {shown(node.name)} is listed twice (also nodes[{names[key]}]); "
                                  "give each node a distinct host, port or name")
            names[key] = i
            login = ("localhost", 0, None) if node.is_local else \
                (node.host.lower().rstrip("."), port, node.user or self.ssh.user)
            if login in logins:
                what = "this machine" if node.is_local else f"{node.host} port {port}"
                raise NodeDup(i, f"node {shown(node.name)} is {what} again (also nodes[{logins[login]}]): two "
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

    @property
    def secret_names(self) -> list[str]:
        """Every secret a run reads: ``secrets:`` (the training's environment), then ``notify: to:``."""
        return [*self.secrets, *(n for n in (self.notify.to if self.notify else []) if n not in self.secrets)]

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

    def on_login_node(self) -> Config:
        """This project as its Slurm cluster's login node sees it: the one node, the workdir its state dir.

        What ``setup``, ``deploy`` and ``doctor`` do to an SSH node they do to the login node
        through this config (its host key pinned and verified like any node's), with the
        shared workdir in place of ``~/.higgsfield`` and plain processes (no Docker, no sudo).
        """
        if self.slurm is None:
            raise ConfigError(f"{self.path or CONFIG_FILE}: no slurm block: this project runs on its SSH nodes")
        lg = self.slurm.login
        login = NodeConfig(host=lg.host, name=lg.name, port=lg.port, user=lg.user, identity_file=lg.identity_file,
                           nproc_per_node=None)
        return self.model_copy(update={"nodes": [login], "state_dir": self.slurm.workdir, "runtime": "process"})

    def node(self, ref: str) -> NodeConfig:
        """The node ``ref`` names: its name, ``host:port``, or its host alone when no other node is on that host.

        The one door for every place a user names a node (``--exclude``, ``--node`` of setup, doctor,
        logs and stacks): a node named ``10.0.0.3:2222`` by default (every node on port 2222) is
        also ``10.0.0.3``. ConfigError (exit 2) for an unknown or an ambiguous ``ref``.
        """
        node = self.find_node(ref)
        if node is None:
            known = ", ".join(str(n.name) for n in self.nodes)
            raise ConfigError(f"{self.path or CONFIG_FILE}: no node named {shown(ref)} (nodes: {known})")
        return node

    def node_name(self, ref: str) -> str:
        """The name of the node ``ref`` names (:meth:`node`); ``ref`` itself when it names none, for the
        caller's own refusal (``--exclude``'s lists the nodes)."""
        node = self.find_node(ref)
        return ref if node is None else str(node.name)

    def find_node(self, ref: str) -> NodeConfig | None:
        """:meth:`node`, with None for a ``ref`` that names no node (ConfigError still for an ambiguous host)."""
        for n in self.nodes:
            if n.name == ref:
                return n
        at = [n for n in self.nodes if ref in (n.host, f"{n.host}:{self.node_port(n)}")]
        if len(at) > 1:
            raise ConfigError(f"{shown(ref)} is {len(at)} nodes ({', '.join(str(n.name) for n in at)}): "
                              "name one of them")
        return at[0] if at else None


class NodeDup(Misplaced):
    """A node listed twice: carries the index of the second entry, so the message names its line."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(("nodes", index), message)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of higgsfield.yml, for editors (yaml-language-server)."""
    schema = Config.model_json_schema(mode="validation")
    schema.get("properties", {}).pop("path", None)
    schema["title"] = "higgsfield.yml"
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema

"""What a GitHub Actions job hands to ``higgsfield ci ...``: read from its environment, checked, typed.

The generated workflows pass every form value through ``env:`` (never through the
script text), so a job's inputs are environment variables:

    HIGGSFIELD_PARAM_<name>   one per @param; "true"/"false" for booleans, numbers as text
    HIGGSFIELD_MORE_PARAMS    name=value pairs for params beyond the form's input limit
    HIGGSFIELD_RUN_NAME       the form's run_name ("" = generated)
    HIGGSFIELD_NODES          the form's node count ("" = every node)
    HIGGSFIELD_STALL_TIMEOUT  the form's stall timeout in seconds ("" = higgsfield.yml's stall_timeout)
    HIGGSFIELD_KILL_TARGET    the kill form's run or experiment name
    HIGGSFIELD_SSH_KEY_FILE   where the job wrote the SSH_KEY secret (mode 0600)

A variable that is set but empty is a form field left empty, which means "use the
default" (GitHub sends "" for an empty number field); only a free-text string field
whose default the user cleared means the empty string. A
variable that is not set at all means the workflow does not pass that input, which
happens when the experiment changed after the workflow was generated.

Pure functions over a mapping, so they are tested without GitHub::

    inputs = run_inputs(exp, os.environ, total_nodes=len(cfg.nodes))
    plan = backend.plan(RunRequest(exp.name, inputs.params, run_name=inputs.run_name, nodes=inputs.nodes, ...))
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from higgsfield.contract.errors import ConfigError, ParamError
from higgsfield.contract.params import RUN_NAME_RE, check_run_name, parse_assignments, resolve
from higgsfield.contract.text import shown

if TYPE_CHECKING:
    from higgsfield.control.config import Config
    from higgsfield.control.project.discovery import DiscoveredExperiment

ENV_PARAM_PREFIX = "HIGGSFIELD_PARAM_"
ENV_MORE_PARAMS = "HIGGSFIELD_MORE_PARAMS"
ENV_RUN_NAME = "HIGGSFIELD_RUN_NAME"
ENV_NODES = "HIGGSFIELD_NODES"
ENV_STALL_TIMEOUT = "HIGGSFIELD_STALL_TIMEOUT"
ENV_KILL_TARGET = "HIGGSFIELD_KILL_TARGET"
ENV_SSH_KEY_FILE = "HIGGSFIELD_SSH_KEY_FILE"

#: Run names go into paths and container names on the nodes.
#: A kill target is a run name or an experiment name.
TARGET_RE = RUN_NAME_RE
_MAX_KEY_BYTES = 64 * 1024
_REGENERATE = "run 'higgsfield build-experiments' and commit .github/workflows"


@dataclass(frozen=True)
class RunInputs:
    """A run form's values, checked.

    ``params`` holds text exactly as ``higgsfield run --param k=v`` would pass it (empty
    optional fields left out, so the default applies); ``typed`` is what the run will see.
    """

    experiment: str
    params: dict[str, str]
    typed: dict[str, Any]
    run_name: str | None
    nodes: int | None
    not_passed: tuple[str, ...] = field(default=())   # declared params the workflow does not pass (stale)
    stall_timeout: float | None = None                # None: higgsfield.yml's


def form_total_nodes(cfg: Config) -> int:
    """The most nodes a run form may ask for: the SSH nodes of higgsfield.yml, or on a Slurm cluster
    Slurm's own limit (there a run's node count is the size of the allocation it asks for)."""
    from higgsfield.contract.slurm_syntax import MAX_NODES

    return MAX_NODES if cfg.slurm is not None else len(cfg.nodes)


def form_nodes_when_empty(cfg: Config) -> str:
    """What an empty ``nodes`` field of a run form means on this project, as the form says it.

    On SSH nodes a run takes every node listed; on a Slurm cluster it asks for ``slurm.nodes``
    (there is no list of nodes to take them all from).
    """
    if cfg.slurm is not None:
        return f"slurm.nodes in higgsfield.yml ({cfg.slurm.nodes})"
    return f"every node in higgsfield.yml ({len(cfg.nodes)})"


def run_inputs(exp: DiscoveredExperiment, environ: Mapping[str, str], total_nodes: int) -> RunInputs:
    """Read and validate a run form from ``environ``; raises ParamError naming the field."""
    passed = {k[len(ENV_PARAM_PREFIX):]: v for k, v in environ.items() if k.startswith(ENV_PARAM_PREFIX)}
    declared = {s.name: s for s in exp.params}
    unknown = sorted(set(passed) - set(declared))
    if unknown:
        raise ParamError(f"experiment '{exp.name}' has no param '{unknown[0]}', but the workflow passes it: "
                         f"the workflow is older than the code; {_REGENERATE}")
    params: dict[str, str] = {}
    for spec in exp.params:
        value = passed.get(spec.name)
        if value is None:
            continue
        free_text = spec.type == "str" and spec.options is None and spec.default is not None
        if value.strip() == "" and not (free_text and not spec.required):
            continue   # an empty field: the default (or "required" from resolve below)
        params[spec.name] = value
    for name, value in parse_more_params(environ.get(ENV_MORE_PARAMS, "")).items():
        if name in passed:
            raise ParamError(f"more_params sets '{name}', which has its own field in the form; set it there")
        params[name] = value
    try:
        typed = resolve(exp.params, params, exp.name)
    except ParamError as e:
        raise ParamError(f"{e} (in the form of 'Run {exp.name}')") from None
    more = ENV_MORE_PARAMS in environ
    not_passed = () if more else tuple(s.name for s in exp.params if s.name not in passed)
    return RunInputs(experiment=exp.name, params=params, typed=typed,
                     run_name=parse_run_name(environ.get(ENV_RUN_NAME, "")),
                     nodes=parse_nodes(environ.get(ENV_NODES, ""), total_nodes), not_passed=not_passed,
                     stall_timeout=parse_stall_timeout(environ.get(ENV_STALL_TIMEOUT, "")))


def parse_more_params(text: str) -> dict[str, str]:
    """``'a=1 b="x y"'`` -> ``{"a": "1", "b": "x y"}``: shell-style words, split in Python, never by a shell."""
    try:
        words = shlex.split(text, comments=False, posix=True)
    except ValueError as e:
        raise ParamError(f"more_params: {e} in {shown(text)}") from None
    try:
        return parse_assignments(words)
    except ParamError as e:
        raise ParamError(f"more_params: {str(e).replace('--param ', '')}") from None


def parse_run_name(text: str) -> str | None:
    """The form's run name, or None (the orchestrator picks one) when empty."""
    name = text.strip()
    if not name:
        return None
    return check_run_name(name, "run_name")


def parse_nodes(text: str, total_nodes: int) -> int | None:
    """The form's node count (1..total_nodes), or None (every node) when empty."""
    raw = text.strip()
    if not raw:
        return None
    try:
        number = float(raw)
    except ValueError:
        number = float("nan")
    if not number.is_integer():
        raise ParamError(f"nodes must be a whole number of nodes, got {shown(raw)}")
    count = int(number)
    if not 1 <= count <= total_nodes:
        raise ParamError(f"nodes must be between 1 and {total_nodes} (higgsfield.yml lists {total_nodes}), "
                         f"got {shown(raw)}")
    return count


def parse_stall_timeout(text: str) -> float | None:
    """The form's stall timeout (seconds >= 0, 0: off), or None (higgsfield.yml's) when empty."""
    raw = text.strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not 0 <= seconds < float("inf"):
        raise ParamError(f"stall_timeout must be a number of seconds >= 0 (0: off), got {shown(raw)}")
    return seconds


def kill_target(argument: str | None, environ: Mapping[str, str]) -> str:
    """The run or experiment to kill: the command-line argument, else ``HIGGSFIELD_KILL_TARGET``."""
    target = (argument if argument is not None else environ.get(ENV_KILL_TARGET, "")).strip()
    if not target:
        raise ParamError(f"nothing to kill: pass a run or experiment name (or set {ENV_KILL_TARGET})")
    if not TARGET_RE.fullmatch(target):
        raise ParamError(f"{shown(target)} is not a run or experiment name: use letters, digits, _ . or -")
    return target


def ci_config(cfg: Config, environ: Mapping[str, str]) -> Config:
    """``cfg`` as a job uses it: the SSH key the job wrote, and the committed known_hosts checked.

    The job writes the ``SSH_KEY`` secret to ``$HIGGSFIELD_SSH_KEY_FILE`` (mode 0600);
    that key replaces every ``identity_file`` in higgsfield.yml, which name files on a
    laptop. Host keys are verified against the committed known_hosts, so the runner
    refuses a node whose key changed exactly as a laptop does; a node that is not
    pinned there is refused too (no trust on first use: a pin made on a throwaway
    runner would protect nothing).
    """
    reached = cfg.on_login_node().nodes if cfg.slurm is not None else cfg.nodes   # a cluster: its login node
    remote = [n for n in reached if not n.is_local]
    key_file = environ.get(ENV_SSH_KEY_FILE, "").strip()
    if not remote:
        return cfg  # no SSH: no host keys to trust or refuse
    if not key_file:
        raise ConfigError(f"{ENV_SSH_KEY_FILE} is not set: the job must write the SSH_KEY secret to a file "
                          f"and name it there; {_REGENERATE}")
    path = Path(key_file)
    try:
        if not path.is_file():  # a FIFO or /dev/zero would block or never end
            raise ConfigError(f"{path}: cannot read the SSH key: "
                              + ("not a regular file" if path.exists() else "no such file"))
        with open(path, "rb") as f:
            text = f.read(_MAX_KEY_BYTES + 1).decode("ascii", errors="replace")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the SSH key: {e.strerror or e}") from None
    if len(text) > _MAX_KEY_BYTES or "\ufffd" in text:
        raise ConfigError(f"{path}: not an SSH private key (too big or not text): the SSH_KEY secret must be the "
                          "private deploy key, as 'higgsfield show-deploy-key' names it")
    if not text.strip():
        raise ConfigError("the SSH_KEY secret is empty or not set: add the private deploy key as a repository "
                          "secret named SSH_KEY (Settings > Secrets and variables > Actions)")
    if path.stat().st_mode & 0o077:
        raise ConfigError(f"{path}: the SSH key file must have mode 0600")
    known_hosts = cfg.known_hosts_path
    if not known_hosts.is_file():
        raise ConfigError(f"{_rel(known_hosts, cfg)} is not in the repository: the runner verifies the nodes' host "
                          "keys against it; run 'higgsfield setup' on a laptop (it pins them) and commit the file")
    out = cfg.model_copy(deep=True)  # every command verifies against the pins: none trusts a new host
    out.ssh.identity_file = str(path)
    for node in out.nodes:
        node.identity_file = None
    if out.slurm is not None:
        out.slurm.login.identity_file = None
    return out


def _rel(path: Path, cfg: Config) -> str:
    try:
        return str(path.relative_to(cfg.project_dir))
    except ValueError:
        return str(path)

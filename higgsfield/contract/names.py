"""What a name a user gives may be: checked in full, refused with the reason and the fix.

Names travel far: a project or experiment name becomes a file name, a workflow key and
a concurrency group; a run name a directory and a container name on every node; a
secret name an environment variable on the nodes; a host an ``ssh`` destination. So
every check here matches the whole string (``\\A...\\Z``: ``$`` would let a trailing
newline through) and each ``check_*`` raises ValueError with a message that quotes
the value through :func:`~higgsfield.contract.text.shown` (cut, one line).

Use::

    check_identifier("alpaca", "experiment name")
    check_secret_name("WANDB_API_KEY")      # 'PATH', 'GITHUB_TOKEN', 'HIGGSFIELD_X' are refused
    check_host("gpu-1.example.com")         # 'a;b', '-oProxyCommand=x', 'user@h', 'h:22' are refused
"""

from __future__ import annotations

import ipaddress
import keyword
import re

from higgsfield.contract.text import has_control, shown

#: Project, experiment and param names: a Python identifier of ASCII letters, digits and _.
NAME_RE = re.compile(r"\A[a-zA-Z_][a-zA-Z0-9_]*\Z")
MAX_NAME = 64
#: Run names: safe as a directory name, a container name part and a shell word. Long enough for the
#: generated EXPERIMENT-YYYYmmdd-HHMMSS-xxxx of a MAX_NAME experiment.
MAX_RUN_NAME = 96
RUN_NAME_RE = re.compile(rf"\A[a-zA-Z0-9][a-zA-Z0-9_.-]{{0,{MAX_RUN_NAME - 1}}}\Z")
#: Secret names: environment variable names, upper case (GitHub secrets are upper case too).
SECRET_RE = re.compile(r"\A[A-Z_][A-Z0-9_]*\Z")
#: Node display names: one word that reads well in a log prefix ("gpu-1", "10.0.0.2:2201").
NODE_NAME_RE = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}\Z")
#: Login user names on the nodes (POSIX portable, as useradd accepts them).
USER_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_.-]{0,31}\Z")
_LABEL_RE = re.compile(r"\A[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\Z")
#: Longest free-form setting (a path, a URL): PATH_MAX is 4096, a URL past 2000 breaks tools.
MAX_TEXT = 2048
#: Hosts that mean "this machine, no SSH".
LOCAL_HOSTS = frozenset({"localhost", "local"})

#: Environment variables a run, torchrun, the node or the GitHub job already sets or relies on:
#: a secret of that name would override it (PATH, RANK) or leak it (GITHUB_TOKEN, SSH_KEY).
RESERVED_SECRETS = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR",
    "HOSTNAME", "IFS", "ENV", "BASH_ENV", "CDPATH", "VIRTUAL_ENV", "CI", "SSH_KEY",
    "PROJECT_NAME", "EXPERIMENT_NAME", "RUN_NAME",
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
    "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
    "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE",
})
#: Prefixes of reserved variables: ours, GitHub's, the dynamic loader's, Python's, torch's, locale, SSH.
RESERVED_PREFIXES = ("HIGGSFIELD_", "GITHUB_", "RUNNER_", "ACTIONS_", "LD_", "DYLD_", "PYTHON", "TORCH",
                     "LC_", "SSH_", "BASH_FUNC_")


def check_identifier(name: object, what: str = "name") -> str:
    """``name`` when it is an identifier of at most MAX_NAME characters and not a Python keyword."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or len(name) > MAX_NAME:
        raise ValueError(f"{what} {shown(name)} is not valid: use 1-{MAX_NAME} letters, digits and _, "
                         "not starting with a digit")
    if keyword.iskeyword(name):
        raise ValueError(f"{what} {shown(name)} is a Python keyword: choose another name")
    return name


def is_run_name(name: object) -> bool:
    return isinstance(name, str) and RUN_NAME_RE.fullmatch(name) is not None


def check_secret_name(name: object) -> str:
    """An environment variable name that no part of a run relies on."""
    if not isinstance(name, str) or not SECRET_RE.fullmatch(name) or len(name) > 128:
        raise ValueError(f"{shown(name)} is not a valid secret name: use UPPER_CASE letters, digits and _")
    if name in RESERVED_SECRETS or name.startswith(RESERVED_PREFIXES):
        raise ValueError(f"secret name {shown(name)} is reserved: the run, torchrun or the GitHub job sets "
                         "or relies on that variable; rename the secret (e.g. MY_" + name.lstrip("_") + ")")
    return name


def check_host(host: object) -> str:
    """A DNS name, an IPv4 or an IPv6 address (or 'localhost'), never an ssh option or 'user@host:port'."""
    if not isinstance(host, str):
        raise ValueError(f"expected a host name (got {shown(host)})")
    where = f"host {shown(host)}"
    if host != host.strip() or not host:
        raise ValueError(f"{where} is empty or has spaces around it")
    if host.startswith("-"):
        raise ValueError(f"{where} starts with '-', which ssh would read as an option")
    if "@" in host:
        raise ValueError(f"{where} has a user in it: put the user under 'user:' and only the host here")
    if host.startswith("[") and host.endswith("]"):
        raise ValueError(f"{where}: write an IPv6 address without brackets")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None:
        if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None \
                and not re.fullmatch(r"[A-Za-z0-9_.-]{1,32}", ip.scope_id):
            raise ValueError(f"{where}: the IPv6 zone is not a network interface name")
        return host
    if ":" in host:
        raise ValueError(f"{where} is neither a host name nor an IP address: put a port under 'port:'")
    name = host[:-1] if host.endswith(".") else host
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL_RE.fullmatch(label) for label in labels):
        raise ValueError(f"{where} is not a valid host name or IP address: use letters, digits, '-' and '.' "
                         "(e.g. gpu-1.example.com, 10.0.0.2)")
    if labels[-1].isdigit():
        raise ValueError(f"{where} is not a valid IP address")
    return host


def check_user(user: object) -> str:
    """A login user name: letters, digits, '_', '.', '-'; never 'root'."""
    if not isinstance(user, str) or not USER_RE.fullmatch(user):
        raise ValueError(f"user {shown(user)} is not a valid user name: use letters, digits, _ . or -, "
                         "not starting with a digit or '-'")
    if user == "root":
        raise ValueError("'root' is refused: use a non-root user with passwordless sudo")
    return user


def check_node_name(name: object) -> str:
    """A node's display name: one word of letters, digits and _ . : - (it prefixes log lines)."""
    if not isinstance(name, str) or not NODE_NAME_RE.fullmatch(name):
        raise ValueError(f"node name {shown(name)} is not valid: use 1-64 letters, digits, _ . : or -, "
                         "starting with a letter, digit or _")
    return name


def check_text(value: object) -> str:
    """A free-form setting (a path, an image, a requirement): not empty, no control characters.

    The message leaves out the setting's name: the config error names the field before it.
    """
    if not isinstance(value, str):
        raise ValueError(f"expected a string (got {shown(value)})")
    if not value.strip():
        raise ValueError("must not be empty: leave the key out for the default")
    if len(value) > MAX_TEXT:
        raise ValueError(f"{shown(value)} is longer than {MAX_TEXT} characters")
    if has_control(value):
        raise ValueError(f"{shown(value)} contains a control character (a newline, tab or escape)")
    if value != value.strip():
        raise ValueError(f"{shown(value)} has spaces around it")
    return value

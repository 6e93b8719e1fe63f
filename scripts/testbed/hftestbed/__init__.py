"""The higgsfield test bed: real sshd hosts, a real Docker engine, an offline base image.

Stdlib only; runs as root on a Debian bookworm machine (local or CI). Its command
line is scripts/testbed/testbed.py: up, down, status, env, start-host / stop-host /
rekey-host I, docker-group add|remove I.

Everything is idempotent: `up` installs what is missing, (re)starts sshd daemons
and dockerd that are not running, and skips the image build when the image is
already in the engine. State (keys, configs, pids, logs) lives in $TESTBED_DIR,
default <repo>/.testbed.

Host i is unix user hfnode{i}, with its own sshd on 127.0.0.{i+2}:2222. Nothing
outside 127.0.0.0/8 is ever a target: addresses are checked before use.

One module per concept: base (state dir, lock, errors), procs (processes and
ports), timings, apt, hosts (the host model, known_hosts, ssh_config), users,
delay (a host "far away"), sshd, dockerd, wheels (download and serve), image,
bed (up / down / status) and cli. This package re-exports what the CLI (scripts/testbed/testbed.py), the tests
(tests/testbed.py) and the benches (bench/_bed.py) use; the rest stays in its module.
"""

from .base import DEFAULT_PORT, TestbedError, exe, host_count, log, state_dir, state_lock
from .bed import down, shell_env, status, up
from .cli import main
from .delay import command_delay, session_log, set_command_delay
from .dockerd import DOCKER_SOCKET, docker_answers, docker_env
from .hosts import Host, existing_hosts, known_hosts_line, make_host
from .image import BASE_IMAGE, BOOTSTRAP_IMAGE, image_exists
from .procs import check_loopback, run
from .sshd import ensure_hosts, host_running, rekey_host, set_host_key, start_host, stop_host
from .users import (
    add_to_docker_group,
    ensure_client_key,
    ensure_user,
    in_docker_group,
    remove_from_docker_group,
    reset_home,
)
from .wheels import TORCH_VERSION

# tests/testbed.py's name for it, from when it was private to one file
_check_loopback = check_loopback

__all__ = [
    "BASE_IMAGE", "BOOTSTRAP_IMAGE", "DEFAULT_PORT", "DOCKER_SOCKET", "Host", "TORCH_VERSION",
    "TestbedError", "add_to_docker_group", "check_loopback", "command_delay", "docker_answers", "docker_env",
    "down", "ensure_client_key", "ensure_hosts", "ensure_user", "exe", "existing_hosts", "host_count",
    "host_running", "image_exists", "in_docker_group", "known_hosts_line", "log", "main", "make_host",
    "rekey_host", "remove_from_docker_group", "reset_home", "run", "session_log", "set_command_delay",
    "set_host_key", "shell_env", "start_host", "state_dir", "state_lock", "status", "stop_host", "up"
]

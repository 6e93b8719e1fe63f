"""The container's first process: read the run's secrets from stdin, then become torchrun.

    python -m higgsfield.node.runtime.launch LOG -- python -m torch.distributed.run ...

The supervisor creates the container with an open stdin and writes one JSON line of
secrets to it once the container runs. This launcher reads that line, merges the
values into its environment, points stdout/stderr at ``LOG`` (appended) and stdin
at ``/dev/null``, and execs the command. So secrets live only in the run's
processes' environments: never in a file on the node, never in ``docker inspect``
(the container's configured environment holds only the run's own variables).
Its umask is 0077, as the supervisor's: what the run writes is the node user's alone.
torchrun's ``--max-restarts`` restarts workers inside this same process tree, so
restarted workers inherit them too.

Only the standard library: this runs inside the project's image, from the invoker's
package mounted at ``/opt/higgsfield-invoker``.
"""

from __future__ import annotations

import json
import os
import select
import sys

WAIT_S = 300.0  # the supervisor writes at once; a container left waiting longer gives up


def read_secrets(fd: int = 0, timeout: float = WAIT_S) -> dict[str, str]:
    """One JSON object on the first line read from ``fd`` (anything after it is dropped)."""
    data = b""
    while b"\n" not in data:
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            raise TimeoutError(f"no secrets on stdin after {timeout:.0f}s")
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    values = json.loads(data.split(b"\n", 1)[0].decode() or "{}")
    if not isinstance(values, dict):
        raise ValueError("the secrets line is not a JSON object")
    return {str(k): str(v) for k, v in values.items()}


def _redirect(log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _stdin_from_devnull() -> None:
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m higgsfield.node.runtime.launch LOG -- COMMAND...", file=sys.stderr)
        return 2
    log, command = args[0], args[2:]
    os.umask(0o077)  # what the run writes is private to the node user, as in the process runtime
    _redirect(log)
    try:
        secrets = read_secrets()
    except (OSError, ValueError, TimeoutError) as e:
        print(f"[higgsfield] cannot read the run's secrets: {e}", file=sys.stderr, flush=True)
        return 1
    _stdin_from_devnull()
    for k, v in secrets.items():
        os.environ.setdefault(k, v)  # the run's own variables win, as in the process runtime
    del secrets
    try:
        os.execvp(command[0], command)
    except OSError as e:
        print(f"[higgsfield] cannot start {command[0]}: {e}", file=sys.stderr, flush=True)
        return 127
    return 0  # pragma: no cover - exec does not return


if __name__ == "__main__":
    sys.exit(main())

"""The command line: ``python3 scripts/testbed/testbed.py up|down|status|env|...`` (see the package doc)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from . import __doc__ as _package_doc
from .base import DEFAULT_HOSTS, USER_PREFIX, TestbedError, require_root, state_dir
from .bed import down, shell_env, status, up
from .hosts import configured_port, make_host
from .sshd import rekey_host, start_host, stop_host
from .users import add_to_docker_group, remove_from_docker_group, user_exists


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="testbed.py", description=(_package_doc or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("up", help="install, start and build what is missing (idempotent)")
    p.add_argument("--hosts", type=int, default=None, help=f"default $TESTBED_HOSTS or {DEFAULT_HOSTS}")
    p.add_argument("--no-docker", action="store_true", help="no dockerd (implies --no-image)")
    p.add_argument("--no-image", action="store_true", help="do not build the base image")
    p.add_argument("--rebuild-image", action="store_true", help="rebuild the image even if cached")
    p.add_argument("--reset-homes", action="store_true", help="empty the node users' homes")
    p.add_argument("--keep-docker-group", action="store_true",
                   help="leave node users' docker group membership alone")
    p = sub.add_parser("down", help="stop the sshd daemons and the dockerd this bed started")
    p.add_argument("--purge", action="store_true", help="also delete node users and the state dir")
    sub.add_parser("status", help="print the state as JSON")
    sub.add_parser("env", help="print shell exports describing the bed")
    for name, text in (("start-host", "start host I's sshd if it is not running"),
                       ("stop-host", "stop host I's sshd (fault injection)"),
                       ("rekey-host", "restart host I's sshd with a new host key")):
        p = sub.add_parser(name, help=text)
        p.add_argument("index", type=int)
        if name == "stop-host":
            p.add_argument("--kill-sessions", action="store_true")
    p = sub.add_parser("docker-group", help="add/remove a node user to/from the docker group")
    p.add_argument("action", choices=["add", "remove"])
    p.add_argument("index", type=int)
    args = ap.parse_args(argv)

    try:
        if args.cmd == "up":
            t = up(hosts=args.hosts, docker=not args.no_docker,
                   image=not (args.no_image or args.no_docker), reset_homes=args.reset_homes,
                   reset_docker_group=not args.keep_docker_group,
                   rebuild_image=args.rebuild_image)
            print("test bed up; phase timings:\n" + t.report())
        elif args.cmd == "down":
            down(purge=args.purge)
        elif args.cmd == "status":
            print(json.dumps(status(), indent=2))
        elif args.cmd == "env":
            print(shell_env(), end="")
        elif args.cmd in ("start-host", "stop-host", "rekey-host"):
            require_root()
            host = make_host(args.index, state_dir(), configured_port(
                state_dir() / "hosts" / f"{USER_PREFIX}{args.index}"))
            if args.cmd == "start-host":
                if not user_exists(host.user):
                    raise TestbedError(f"{host.user} does not exist; run `up` first")
                print(start_host(host))
            elif args.cmd == "stop-host":
                print("stopped" if stop_host(host, kill_sessions=args.kill_sessions)
                      else "was not running")
            else:
                print(rekey_host(host))
        elif args.cmd == "docker-group":
            require_root()
            host = make_host(args.index)
            (add_to_docker_group if args.action == "add" else remove_from_docker_group)(host)
    except TestbedError as e:
        print(f"testbed: error: {e}", file=sys.stderr)
        return 1
    return 0

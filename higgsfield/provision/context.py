"""What a provisioning step gets: the node, its transport, a log of every command, and facts.

Every command a step runs goes through :meth:`NodeContext.run`, which writes the
argv, exit status and full output to the node's log file
(``.higgsfield/logs/setup/<node>.log``), so a failure's one-line reason can point
there for the rest.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from higgsfield.errors import HiggsfieldError, StepFailed
from higgsfield.provision.wheels import Artifacts
from higgsfield.remote.base import CommandResult, Transport
from higgsfield.remote.invoker import node_state_dir

if TYPE_CHECKING:
    from higgsfield.config import Config, NodeConfig


@dataclass
class SetupOptions:
    """Knobs of one ``setup`` run (the CLI fills them from its flags)."""

    cache_dir: Path | None = None
    """Where wheels are cached; default ``<project>/.higgsfield/cache``."""
    log_dir: Path | None = None
    """Where per-node logs go; default ``<project>/.higgsfield/logs/setup``."""
    deploy_key: Path | None = None
    """The deploy private key; default ``$XDG_CONFIG_HOME/higgsfield/keys/<project>/deploy_key``."""
    wheelhouse: bool = True
    """Send the dependencies' wheels (nodes need no index); False: the node's pip uses its index."""


class NodeLog:
    """The full output of every command on one node, appended to a file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[str] = open(path, "w")  # noqa: SIM115 - closed by close()

    def write(self, text: str) -> None:
        self._f.write(text if text.endswith("\n") else text + "\n")
        self._f.flush()

    def command(self, result: CommandResult, seconds: float) -> None:
        self.write(f"$ {shlex.join(result.argv)}    # exit {result.exit_status}, {seconds:.2f}s")
        for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
            if text.strip():
                self.write("".join(f"  {name}| {ln}\n" for ln in text.rstrip("\n").splitlines()))

    def close(self) -> None:
        self._f.close()


@dataclass
class NodeContext:
    cfg: Config
    node: NodeConfig
    transport: Transport
    log: NodeLog
    options: SetupOptions
    artifacts: Artifacts
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.node.name)

    @property
    def state_dir(self) -> str:
        return node_state_dir(self.cfg)

    async def run(self, argv: Sequence[str], *, check: bool = True, input: str | bytes | None = None,
                  timeout: float | None = None) -> CommandResult:
        """Run ``argv`` on the node, logging it; ``check`` raises CommandError on failure."""
        start = time.monotonic()
        try:
            result = await self.transport.run(argv, input=input, timeout=timeout, check=False)
        except HiggsfieldError as e:
            self.log.write(f"$ {shlex.join(argv)}    # {e}")
            raise
        self.log.command(result, time.monotonic() - start)
        return result.check() if check else result

    async def ok(self, argv: Sequence[str]) -> bool:
        """Whether ``argv`` exits 0 (a missing command counts as failing)."""
        return (await self.run(argv, check=False)).ok

    async def uid(self) -> int:
        if "uid" not in self.facts:
            self.facts["uid"] = int((await self.run(["id", "-u"])).stdout.strip())
        return int(self.facts["uid"])

    async def user(self) -> str:
        if "user" not in self.facts:
            self.facts["user"] = (await self.run(["id", "-un"])).stdout.strip()
        return str(self.facts["user"])

    async def sudo(self, argv: Sequence[str], *, check: bool = True,
                   timeout: float | None = None) -> CommandResult:
        """Run as root: directly when logged in as root (local), else through non-interactive sudo."""
        prefix = [] if await self.uid() == 0 else ["sudo", "-n"]
        return await self.run([*prefix, *argv], check=check, timeout=timeout)

    async def apt_install(self, *packages: str) -> None:
        """``apt-get install`` from the distribution's repositories (refreshing the lists once)."""
        if not await self.ok(["sh", "-c", "command -v apt-get"]):
            raise StepFailed(f"no apt-get on {self.name}: install {' '.join(packages)} by hand "
                             "(only Debian/Ubuntu nodes are provisioned automatically)")
        if not self.facts.get("apt_updated"):
            await self.sudo(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "update", "-q"], timeout=900)
            self.facts["apt_updated"] = True
        await self.sudo(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q",
                         "--no-install-recommends", *packages], timeout=1800)

"""What a provisioning step gets: the node, its transport, a log of every command, and facts.

Every command a step runs goes through :meth:`NodeContext.run`, which writes the
argv, exit status and full output to the node's log file
(``.higgsfield/logs/setup/<node>.log``), so a failure's one-line reason can point
there for the rest.

A step's ``check`` reads the node through :meth:`NodeContext.read`: the runner first
asks every selected step's :meth:`~higgsfield.control.provision.step.Step.reads` of the node
in one probe (one SSH session, :mod:`higgsfield.control.remote.probe`), so a re-run where
everything is in place costs a node one session for all its checks. Once a step has
applied something the answers are stale: the next read probes again (one session,
which the following steps' checks share). A node that cannot run the probe answers
each read by running it.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from higgsfield.contract.errors import HiggsfieldError, StepFailed
from higgsfield.control.provision.wheels import Artifacts
from higgsfield.control.remote.base import CommandResult, Transport
from higgsfield.control.remote.invoker import node_state_dir
from higgsfield.control.remote.probe import Probe, Read, probe

if TYPE_CHECKING:
    from higgsfield.control.config import Config, NodeConfig


ID_U = ("id", "-u")
ID_UN = ("id", "-un")
BASE_READS = (Read(ID_U), Read(ID_UN))
"""What every probe asks: who the login is (:meth:`NodeContext.uid`, :meth:`NodeContext.user`)."""


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

    def command(self, result: CommandResult, seconds: float | None) -> None:
        took = f"{seconds:.2f}s" if seconds is not None else "in the probe"
        self.write(f"$ {shlex.join(result.argv)}    # exit {result.exit_status}, {took}")
        for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
            if text.strip():
                self.write("".join(f"  {name}| {ln}\n" for ln in text.rstrip("\n").splitlines()))

    def close(self) -> None:
        self._f.close()


@dataclass
class Learned:
    """What this run's steps learned of the node, asked once and kept (None: not asked yet)."""

    uid: int | None = None
    user: str | None = None
    arch: str = ""                 # ``uname -m``, as the OS step read it
    apt_updated: bool = False      # ``apt-get update`` ran since the last repository was added


@dataclass
class NodeContext:
    cfg: Config
    node: NodeConfig
    transport: Transport
    log: NodeLog
    options: SetupOptions
    artifacts: Artifacts
    facts: Learned = field(default_factory=Learned)
    reads: list[Read] = field(default_factory=list)
    """What the probe asks the node: the reads of the steps of this run (see the module doc)."""
    probed: Probe | None = None
    stale: bool = True
    """The probe's answers may be out of date (none yet, or a step applied something since)."""

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

    async def probe(self) -> Probe:
        """Ask the node all of ``reads`` at once (one session), logging every answer."""
        self.probed = got = await probe(self.transport, self.reads)
        self.stale = False
        self.log.write(f"# probe: {len(got.answers)} read-only commands in one session, {got.seconds:.2f}s"
                       + (f" ({got.error}: each check runs its own commands)" if got.error else ""))
        if got.uid is not None:
            self.facts.uid = got.uid
        for result in got.answers.values():
            self.log.command(result, None)
        return got

    async def read(self, argv: Sequence[str], *, root: bool = False, user_first: bool = False) -> CommandResult:
        """A read-only command's result (never raises for its exit status): from the node's probe when one
        of this run's steps declared it, else run now (as root through :meth:`sudo` for ``root``; with
        ``user_first`` as the login user first, see :class:`~higgsfield.control.remote.probe.Read`)."""
        want = Read(tuple(argv), root, user_first)
        if want in self.reads:
            got = (await self.probe() if self.stale else self.probed)
            answer = got.answer(want) if got else None
            if answer is not None:
                return answer
        if root and user_first:
            first = await self.run(argv, check=False)
            if first.ok:
                return first
        return await (self.sudo(argv, check=False) if root else self.run(argv, check=False))

    def changed(self) -> None:
        """Something on the node changed: the next read probes again."""
        self.stale = True

    async def ok(self, argv: Sequence[str]) -> bool:
        """Whether ``argv`` exits 0 (a missing command counts as failing)."""
        return (await self.run(argv, check=False)).ok

    async def uid(self) -> int:
        if self.facts.uid is None:
            self.facts.uid = int((await self.read(ID_U)).check().stdout.strip())
        return self.facts.uid

    async def user(self) -> str:
        if self.facts.user is None:
            self.facts.user = (await self.read(ID_UN)).check().stdout.strip()
        return self.facts.user

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
        if not self.facts.apt_updated:
            await self.sudo(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "update", "-q"], timeout=900)
            self.facts.apt_updated = True
        await self.sudo(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q",
                         "--no-install-recommends", *packages], timeout=1800)

"""Trusting a new host: the one place where a host key gets pinned.

``higgsfield setup`` calls :func:`scan_hosts` first: every node with no pinned key
(and every node named by ``--repin``) is asked for its host key by a bare key
exchange, concurrently, without logging in or running anything. The CLI shows the
fingerprints and asks once (:func:`consent` decides whether it may ask, must refuse,
or was told to accept by ``--accept-new-host-keys``); only then does
:func:`~higgsfield.control.provision.runner.provision` pin exactly the keys that were shown
(:func:`pin_accepted`) and connect, strictly, to provision. A node that offers
another key between the scan and the connection is refused like any changed key.

Every other command only verifies (:mod:`higgsfield.control.remote.hostkeys`), so a pin is
never made without a fingerprint a human saw, or an automation vouched for.

Use::

    scan = await scan_hosts(cfg, cfg.nodes, repin=["gpu-2"])
    for k in scan.new: print(k.node, k.entry, k.fingerprint)
    if consent(scan, accept_flag=False, interactive=True, ci=False) == "ask" and input() == "y":
        await provision(cfg, host_keys=scan)
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from higgsfield.contract.errors import HiggsfieldError, HostNotPinnedError
from higgsfield.control.remote.hostkeys import PinnedHosts, entry_name, fingerprint, key_type, shown_path

if TYPE_CHECKING:
    import asyncssh

    from higgsfield.control.config import Config, NodeConfig


@dataclass(frozen=True)
class NewHostKey:
    """A key a node offers that is not pinned for it yet (first contact, or ``--repin``)."""

    node: str
    host: str
    port: int
    key: asyncssh.SSHKey
    replaces: tuple[str, ...] = ()
    """The fingerprints pinned for the node now (``--repin``); empty on first contact."""

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.key)

    @property
    def entry(self) -> str:
        return entry_name(self.host, self.port)

    @property
    def key_type(self) -> str:
        return key_type(self.key)

    def describe(self) -> str:
        was = f" (replacing {', '.join(self.replaces)})" if self.replaces else ""
        return f"{self.node} {self.entry} {self.key_type} {self.fingerprint}{was}"


@dataclass
class HostScan:
    """What :func:`scan_hosts` found."""

    new: list[NewHostKey] = field(default_factory=list)
    """Keys to show and confirm before anything is sent to those nodes."""
    unchanged: list[str] = field(default_factory=list)
    """``--repin`` nodes that offer exactly the key already pinned: nothing to re-pin."""
    failed: dict[str, str] = field(default_factory=dict)
    """node -> why its key could not be fetched (unreachable); setup reports it without a second try."""

    def for_node(self, node: str) -> NewHostKey | None:
        return next((k for k in self.new if k.node == node), None)


async def scan_hosts(cfg: Config, nodes: Sequence[NodeConfig], repin: Sequence[str] = ()) -> HostScan:
    """Fetch the host key of every node in ``nodes`` that has none pinned, and of the ``repin`` nodes.

    ``repin`` names must be nodes of the config (ConfigError otherwise); local nodes
    have no host key and are skipped. Nothing is written and nothing is sent.
    """
    from higgsfield.control.remote.ssh import SSHTransport

    pins = PinnedHosts(cfg.known_hosts_path)
    repin_nodes = [cfg.node(name) for name in repin]  # an unknown name is a ConfigError
    wanted: list[NodeConfig] = []
    for node in [*nodes, *repin_nodes]:
        if node.is_local or any(node is w for w in wanted):
            continue
        if any(node is r for r in repin_nodes) or not pins.lookup(node.host, cfg.node_port(node)):
            wanted.append(node)

    async def one(node: NodeConfig) -> asyncssh.SSHKey:
        return await SSHTransport.from_config(cfg, node).scan_host_key()

    keys = await asyncio.gather(*(one(n) for n in wanted), return_exceptions=True)
    scan = HostScan()
    for node, got in zip(wanted, keys, strict=True):
        name = str(node.name)
        if isinstance(got, BaseException):
            if not isinstance(got, Exception):
                raise got
            scan.failed[name] = str(getattr(got, "reason", None) or got) if isinstance(got, HiggsfieldError) \
                else f"{type(got).__name__}: {got}"
            continue
        port = cfg.node_port(node)
        pinned = pins.lookup(node.host, port)
        if pinned and [got] == pinned:
            scan.unchanged.append(name)
        else:
            scan.new.append(NewHostKey(name, node.host, port, got, tuple(fingerprint(k) for k in pinned)))
    return scan


Consent = Literal["accept", "ask", "refuse"]


def consent(scan: HostScan, *, accept_flag: bool, interactive: bool, ci: bool) -> Consent:
    """Whether setup may trust ``scan.new``: accepted by the flag, to ask the user, or refused.

    - ``--accept-new-host-keys`` accepts (automation that checked the fingerprints another way);
    - under CI (``CI=true``) nothing else does: no one is there to compare a fingerprint;
    - otherwise setup asks, when it can (stdin is a terminal), and refuses when it cannot.
    """
    if accept_flag:
        return "accept"
    if ci or not interactive:
        return "refuse"
    return "ask"


def refusal(scan: HostScan, *, ci: bool, path: str) -> HostNotPinnedError:
    """The one-line error for keys setup may not trust without a human (no terminal, or CI)."""
    why = ("CI is set, and in CI setup trusts a new host key only with --accept-new-host-keys" if ci else
           "stdin is not a terminal, so setup cannot ask")
    return HostNotPinnedError(_nodes(scan), f"{_keys(scan, path)}; {why}: compare the fingerprints with the "
                                            "nodes' own (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub) and "
                                            "re-run with --accept-new-host-keys")


def declined(scan: HostScan, path: str) -> HostNotPinnedError:
    return HostNotPinnedError(_nodes(scan), f"{_keys(scan, path)}; not accepted: nothing was pinned, and nothing "
                                            "was sent to any node")


def _nodes(scan: HostScan) -> str:
    return ", ".join(k.node for k in scan.new)


def _keys(scan: HostScan, path: str) -> str:
    keys = ", ".join(f"{k.entry} offers {k.fingerprint}" for k in scan.new)
    return f"host key{'s' if len(scan.new) > 1 else ''} not pinned in {path}: {keys}"


def pin_accepted(cfg: Config, accepted: Sequence[NewHostKey]) -> None:
    """Pin exactly the keys the user accepted (replacing the old pins of a ``--repin`` node)."""
    pins = PinnedHosts(cfg.known_hosts_path)
    for k in accepted:
        pins.pin(k.host, k.port, k.key, comment=f"higgsfield:{k.node}", replace=bool(k.replaces))


def trusted_keys(scan: HostScan | None) -> Mapping[str, list[asyncssh.SSHKey]]:
    """node -> the accepted key, for a dry run's transports (which trust it without pinning it)."""
    return {k.node: [k.key] for k in scan.new} if scan else {}


def known_hosts_shown(cfg: Config) -> str:
    return shown_path(cfg.known_hosts_path)

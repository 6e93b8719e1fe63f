"""The rendezvous check: node 0 reachable from the other nodes on the rendezvous port range.

Node 0 listens briefly on a free port of :data:`~higgsfield.contract.ports.RENDEZVOUS_PORTS`
(the embedded ``_LISTEN`` script, run with the node's python3), and every other reachable
node connects to it (``_CONNECT``). Its own module because, unlike the other checks, it is
not a function of one node's probe: it spans nodes, costs each one more SSH session, and
carries the two scripts it runs there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from higgsfield.contract.errors import HiggsfieldError
from higgsfield.contract.ports import RENDEZVOUS_PORTS
from higgsfield.control.doctor.probe import COMMAND_TIMEOUT_S
from higgsfield.control.doctor.report import CheckName, NodeDiagnosis, Probe
from higgsfield.control.remote.base import CommandResult, Transport
from higgsfield.control.remote.fanout import Group, Member

if TYPE_CHECKING:
    from higgsfield.control.config import Config

_LISTEN = """\
import socket, sys, time
lo, hi, wait, want = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
for port in range(lo, hi + 1):
    s = socket.socket()
    try:
        s.bind(("", port))
        break
    except OSError:
        s.close()
else:
    print("none", flush=True)
    sys.exit(3)
s.listen(64)
s.settimeout(0.2)
print(port, flush=True)
end, got = time.monotonic() + wait, 0
while got < want and time.monotonic() < end:
    try:
        c, _ = s.accept()
        c.close()
        got += 1
    except socket.timeout:
        pass
print("accepted", got, flush=True)
"""

_CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), float(sys.argv[3])).close()"


async def _run(t: Transport, argv: Sequence[str]) -> CommandResult:
    return await t.run(argv, check=False, timeout=COMMAND_TIMEOUT_S)


async def _rendezvous(cfg: Config, chosen: Group, up: Group, diags: dict[str, NodeDiagnosis]) -> None:
    """Node 0 listens on a free port of the rendezvous range; every other reachable node connects to it."""
    master = cfg.nodes[0]
    mname = str(master.name)
    listening = next((m for m in up.members if m.node is master), None)
    others = [m for m in up.members if m.node is not master]
    lo, hi = RENDEZVOUS_PORTS
    if not others:
        return
    if listening is None:
        chose_master = any(m.node is master for m in chosen.members)
        for m in others:
            diags[m.name].checks[CheckName.RENDEZVOUS] = Probe(True, "node 0 down" if chose_master else "-")
        return
    if master.is_local and any(not m.node.is_local for m in others):
        for m in others:
            diags[m.name].checks[CheckName.RENDEZVOUS] = Probe(
                False, "localhost", "node 0 is 'localhost', which other machines cannot reach",
                "list node 0 by an address the other nodes can reach")
        return
    listener = listening.transport.stream(["python3", "-c", _LISTEN, str(lo), str(hi), "10", str(len(others))])
    try:
        first = await asyncio.wait_for(listener.__anext__(), COMMAND_TIMEOUT_S)
        if not first.isdigit():
            diags[mname].checks[CheckName.RENDEZVOUS] = Probe(False, "no port", f"no free port in {lo}-{hi} on node 0",
                                                      "free a port in the range (stale runs?)")
            return
        port = int(first)

        async def connect(m: Member) -> Probe:
            r = await _run(m.transport, ["python3", "-c", _CONNECT, master.host, str(port), "3"])
            if r.ok:
                return Probe(True, f"{master.host}:{port} ok")
            why = (r.stderr.strip().splitlines() or ["failed"])[-1]
            return Probe(False, "blocked", f"cannot reach node 0 at {master.host}:{port} ({why})",
                         f"allow TCP {lo}-{hi} from the other nodes to {master.host} (firewall / security group)")

        for r in await Group(others).run(connect):
            diags[r.node].checks[CheckName.RENDEZVOUS] = r.value if r.value is not None else Probe(False, "error", r.reason)
        diags[mname].checks[CheckName.RENDEZVOUS] = Probe(True, f"listens :{port}")
    except (HiggsfieldError, asyncio.TimeoutError, StopAsyncIteration) as e:
        diags[mname].checks[CheckName.RENDEZVOUS] = Probe(False, "error", f"cannot listen on node 0: {e}")
    finally:
        await listener.aclose()  # type: ignore[attr-defined]

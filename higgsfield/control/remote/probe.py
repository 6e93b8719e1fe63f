"""One probe per node: every read-only command a check needs, run on the node at once, in ONE SSH session.

Every SSH session costs a round trip or more (a far node, a slow login), so the
checks of ``setup`` and ``doctor`` do not each open their own: they declare their
commands as :class:`Read` s, and :func:`probe` sends them all to the node in one
``python3 -c <script> <json>`` command, which runs them concurrently (each with its
own timeout) and answers with one JSON line: every command's exit status, stdout and
stderr. A check then reads its answers as the :class:`CommandResult` s it would have
got by running the commands itself.

- ``Read(argv, root=True)`` runs as root: directly when the login is root, else
  through ``sudo -n`` (as :meth:`~higgsfield.control.provision.context.NodeContext.sudo` does);
  with ``user_first`` as the login user first, through sudo only if that fails. The
  same command asked twice (as the same user) runs once.
- ``clock=True`` also measures the node's clock: the script says ``ready``, the
  control side sends one line and the node answers with its time, so the skew is
  taken against the midpoint of that exchange alone, not of the login before it
  (a delayed login would bias it by half its latency).
- A node that cannot run the script (no ``python3``, garbled output) gives a probe
  with ``error`` set and no answers: the caller runs its commands one by one, as
  before. Losing the connection raises, as any command does.

The commands are argument lists (JSON in one argument, quoted by the transport); the
script needs only the node's python3 standard library (3.6 or newer).

Use::

    p = await probe(transport, [Read(("uname", "-sm")), Read(("docker", "info"), root=True)], clock=True)
    p.answer(Read(("uname", "-sm"))).stdout, p.clock.skew_s
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from higgsfield.contract.codec import decode, rule
from higgsfield.contract.decode import DecodeError, loads
from higgsfield.control.remote.base import CommandResult, Transport

READ_TIMEOUT_S = 60.0

_SCRIPT = """\
import json, os, subprocess, sys, threading, time
spec = json.loads(sys.argv[1])
if spec.get("clock"):
    print("ready", flush=True)
    sys.stdin.readline()
    print("%.6f" % time.time(), flush=True)
uid = os.getuid()
reads = spec["reads"]
results = [None] * len(reads)
memo, lock = {}, threading.Lock()
def execute(argv, as_root, timeout):
    key = json.dumps([as_root, argv])
    with lock:
        mine = key not in memo
        if mine:
            memo[key] = [threading.Event(), None]
    slot = memo[key]
    if not mine:
        slot[0].wait()
        return slot[1]
    run = ["sudo", "-n"] + argv if as_root else argv
    try:
        p = subprocess.run(run, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout)
        code = p.returncode if p.returncode >= 0 else 128 - p.returncode
        slot[1] = [code, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"), as_root]
    except FileNotFoundError:
        slot[1] = [127, "", "%s: command not found" % run[0], as_root]
    except subprocess.TimeoutExpired:
        slot[1] = [124, "", "'%s' timed out after %gs" % (run[0], timeout), as_root]
    except OSError as e:
        slot[1] = [126, "", "%s: %s" % (run[0], e), as_root]
    slot[0].set()
    return slot[1]
def one(i, argv, root, user_first, timeout):
    r = execute(argv, root and uid != 0 and not user_first, timeout)
    if root and user_first and uid != 0 and r[0] != 0:
        r = execute(argv, True, timeout)
    results[i] = r
threads = [threading.Thread(target=one, args=(i,) + tuple(r)) for i, r in enumerate(reads)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"uid": uid, "results": results}))
"""


@dataclass(frozen=True)
class Read:
    """A read-only command a check needs answered: its argv, and whether it runs as root."""

    argv: tuple[str, ...]
    root: bool = False
    user_first: bool = False
    """With ``root``: run as the login user first, and through sudo only if that fails; for a command
    whose answer is the same for both (the docker engine's info), so a user who may use docker costs
    no sudo, and shares the run with the same command read as the user."""
    timeout: float = field(default=READ_TIMEOUT_S, compare=False)
    """Seconds the command may run on the node (it then answers exit 124)."""


@dataclass(frozen=True)
class Clock:
    """The node's clock against this machine's, from one exchange of lines (see the module doc)."""

    skew_s: float
    """The node's time minus this machine's at the same instant."""
    rtt_s: float
    """The exchange's round trip: the skew's uncertainty is half of it."""


@dataclass
class Probe:
    """What one node answered: each read's result, its login's uid and, if asked, its clock."""

    node: str
    uid: int | None = None
    answers: dict[Read, CommandResult] = field(default_factory=dict)
    clock: Clock | None = None
    error: str | None = None
    """Why the node could not run the probe (then ``answers`` is empty); None when it did."""
    seconds: float = 0.0

    def answer(self, read: Read) -> CommandResult | None:
        return self.answers.get(read)


def probe_argv(reads: Sequence[Read], *, clock: bool = False) -> list[str]:
    """The one command that answers ``reads`` on a node (python3 and its standard library only)."""
    spec = {"clock": clock, "reads": [[list(r.argv), r.root, r.user_first, r.timeout] for r in reads]}
    return ["python3", "-c", _SCRIPT, json.dumps(spec, separators=(",", ":"))]


async def probe(transport: Transport, reads: Sequence[Read], *, clock: bool = False,
                timeout: float | None = None) -> Probe:
    """Ask the node every read at once, in one session; see the module doc.

    ``timeout`` bounds the whole probe (default: the longest read's timeout plus a
    margin, but never past the transport's ``command_timeout``: the probe is one command
    to the user, who set how long a command may take); a connection lost or a probe
    timed out raises CommandError.
    """
    unique = list(dict.fromkeys(reads))
    limit = timeout if timeout is not None else max((r.timeout for r in unique), default=0) + 30
    if transport.command_timeout is not None:
        limit = min(limit, transport.command_timeout)
    argv = probe_argv(unique, clock=clock)
    start = time.monotonic()
    measured: Clock | None = None
    if clock:
        result, measured = await asyncio.wait_for(_with_clock(transport, argv), limit)
    else:
        result = await transport.run(argv, check=False, timeout=limit)
    got = Probe(transport.node, seconds=time.monotonic() - start, clock=measured)
    try:
        answer = _answer(result.stdout, len(unique)) if result.ok else None
    except DecodeError:
        answer = None
    if answer is None:
        tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or ["no output"]
        got.error = f"the probe (python3) exited {result.exit_status}: {tail[0][:200]}"
        got.clock = None
        return got
    got.uid = answer.uid
    for read, (code, out, err, as_root) in zip(unique, answer.results, strict=True):
        ran = ("sudo", "-n", *read.argv) if as_root else read.argv
        got.answers[read] = CommandResult(transport.node, ran, code, out, err)
    return got


def _results(v: object) -> list[tuple[int, str, str, bool]]:
    what = "a list of [exit, stdout, stderr, as_root]"
    if not isinstance(v, list):
        raise TypeError(what)
    out = []
    for item in v:
        if not (isinstance(item, list) and len(item) == 4):
            raise TypeError(what)
        code, stdout, stderr, as_root = item
        if isinstance(code, bool) or not isinstance(code, int) or not isinstance(stdout, str) \
                or not isinstance(stderr, str) or not isinstance(as_root, bool):
            raise TypeError(what)
        out.append((code, stdout, stderr, as_root))
    return out


@dataclass(frozen=True)
class _Answer:
    """The script's last line: the login's uid, and one ``[exit, stdout, stderr, as_root]`` per read, in order."""

    WHAT: ClassVar[str] = "probe's answer"

    uid: int
    results: list[tuple[int, str, str, bool]] = field(metadata=rule(decode=_results))


def _answer(stdout: str, reads: int) -> _Answer:
    """The probe's answer to ``reads`` reads, decoded once; DecodeError (one line) when it is not one."""
    lines = stdout.strip().splitlines()
    answer = decode(_Answer, loads(lines[-1] if lines else ""))
    if len(answer.results) != reads:
        raise DecodeError(f"the probe answered {len(answer.results)} reads of {reads}")
    return answer


async def _with_clock(transport: Transport, argv: Sequence[str]) -> tuple[CommandResult, Clock | None]:
    async with transport.session(argv) as s:
        if await s.receive() != "ready":
            return await s.finish(), None
        sent = time.time()
        t0 = time.perf_counter()
        await s.send("clock\n")
        line = await s.receive()
        rtt = time.perf_counter() - t0
        try:
            measured: Clock | None = Clock(float(line or "") - (sent + rtt / 2), rtt)
        except ValueError:
            measured = None
        return await s.finish(), measured

"""LocalTransport timeouts and cancellation, and the fan-out's handling of failures."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from higgsfield.contract.errors import CommandError
from higgsfield.control.config import Config
from higgsfield.control.remote.base import Transport
from higgsfield.control.remote.fanout import Group, Member, transport_for
from higgsfield.control.remote.local import LocalTransport


def test_default_command_timeout_bounds_a_run(tmp_path: Path) -> None:
    t = LocalTransport("l", home=str(tmp_path), command_timeout=0.3)
    start = time.monotonic()
    with pytest.raises(CommandError, match="'sleep' timed out after 0.3s"):
        asyncio.run(t.run(["sleep", "30"]))
    assert time.monotonic() - start < 3
    assert asyncio.run(t.run(["sleep", "0.5"], timeout=5)).ok  # timeout= overrides the default


def test_transport_for_passes_the_configured_command_timeout(tmp_path: Path) -> None:
    cfg = Config.model_validate({"name": "p", "nodes": [{"host": "localhost"}], "ssh": {"command_timeout": 7}})
    t = transport_for(cfg, cfg.nodes[0])
    assert isinstance(t, LocalTransport) and t.command_timeout == 7


def test_cancelled_run_kills_the_child(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"

    async def main() -> int:
        t = LocalTransport("l", home=str(tmp_path))
        task = asyncio.create_task(t.run(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 30"]))
        deadline = time.monotonic() + 5
        while not (pidfile.exists() and pidfile.read_text().strip()):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return int(pidfile.read_text())

    pid = asyncio.run(main())
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(pid, 0)


# The dashboard's reads, as they end: in an anyio task group whose scope is cancelled, which cancels every await
# inside it, the clean-up's too. The child takes a second to end after SIGTERM (as an invoker's `logs -f` may): a
# wait given up left it unreaped past the loop's close, and the dashboard printed "Loop ... that handles pid ...
# is closed" and a traceback ("Event loop is closed") on its way out, in a CI run.
_CANCELLED_READ = """
import os, sys, anyio
from higgsfield.control.remote.local import LocalTransport
how, home, pidfile = sys.argv[1:]
argv = ["sh", "-c", f"trap 'sleep 1; exit 0' TERM; echo $$ > {pidfile}; while :; do sleep 0.05; done"]
t = LocalTransport("l", home=home)

async def read():
    if how == "run":
        await t.run(argv)
    else:
        async for _ in t.stream(argv):
            pass

async def main():
    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        with anyio.fail_after(10):
            while not (os.path.exists(pidfile) and open(pidfile).read().strip()):
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()

anyio.run(main)
import gc, time
gc.collect()
time.sleep(1.5)   # past the child's own end, had it been left running
print(open(pidfile).read().strip())
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["run", "stream"])
def test_a_read_cancelled_by_an_anyio_scope_reaps_its_child_before_the_loop_closes(tmp_path: Path, how: str) -> None:
    pytest.importorskip("anyio")
    pidfile = tmp_path / "pid"
    proc = subprocess.run([sys.executable, "-c", _CANCELLED_READ, how, str(tmp_path), str(pidfile)],
                          capture_output=True, text=True, timeout=45, check=False)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]
    with pytest.raises(ProcessLookupError):  # ended and reaped
        os.kill(int(proc.stdout.strip()), 0)


def test_run_takes_no_env() -> None:
    import inspect

    from higgsfield.control.remote.ssh import SSHTransport

    for cls in (Transport, LocalTransport, SSHTransport):
        assert "env" not in inspect.signature(cls.run).parameters


def test_fanout_turns_exceptions_into_results_but_not_exit_or_interrupt(tmp_path: Path) -> None:
    ts = [LocalTransport("a", home=str(tmp_path)), LocalTransport("b", home=str(tmp_path))]
    group = Group([Member(None, t, i) for i, t in enumerate(ts)])  # type: ignore[arg-type]  # (no config needed)

    async def fails(m: Member) -> None:
        raise RuntimeError(f"boom on {m.name}")

    results = asyncio.run(group.run(fails))
    assert [r.reason for r in results] == ["RuntimeError: boom on a", "RuntimeError: boom on b"]

    async def exits(m: Member) -> None:
        raise SystemExit(3)

    with pytest.raises(SystemExit):
        asyncio.run(group.run(exits))

"""What a rank prints reaches the user whatever it is: a 10 MiB line, invalid UTF-8, NUL, terminal escapes.

A line past 64 KiB is cut with a marker at the node (``invoker logs``) and every line after
it arrives, in ``run``'s followed output, ``logs`` and ``logs -f``; control bytes show inert
on a terminal. Local runs (a real torchrun on localhost), plus one through a real sshd.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import select
import subprocess
import sys
import time
import tty
from pathlib import Path

import pytest
from helpers_project import local_project

from higgsfield.contract.text import MAX_LINE, inert
from higgsfield.control.cli._lines import clean

REPO = Path(__file__).resolve().parents[2]
BIG = 10 << 20          # the long line's payload, bytes
COUNT = 1000            # numbered lines after it

LOUD = '''
import sys, time
from higgsfield.experiment import experiment, param

@experiment("loud")
@param("pause", default=0.0)
def loud(params):
    time.sleep(params.pause)
    out = sys.stdout.buffer
    out.write(b"big:" + b"x" * (10 << 20) + b"\\n")
    for i in range(1000):
        out.write(f"n {i:04d}\\n".encode())
    out.write(b"bad \\xff\\xfe utf8\\n")
    out.write(b"nul a\\x00b end\\n")
    out.write(b"esc \\x1b[31mred\\x1b[0m \\x1b]0;title\\x07 cr\\rback\\x08 del\\x7f done\\n")
    out.write(b"last line\\n")
    out.flush()
'''

TAG = re.compile(r"^(?:\x1b\[\d+m)?localhost/0(?:\x1b\[0m)? \| ", re.M)


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    return local_project(tmp_path, "localproj", {"loud.py": LOUD})


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONIOENCODING": "utf-8"}
    env.pop("HIGGSFIELD_DEBUG", None)
    return env


def hf(project: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=project, capture_output=True,
                          encoding="utf-8", errors="strict", timeout=timeout, env=_env())


def texts(stdout: str) -> list[str]:
    """Rank 0's lines of ``run``/``logs`` output, without the ``localhost/0 | `` tag."""
    return [TAG.sub("", line) for line in stdout.split("\n") if TAG.match(line)]


def check_all_arrived(lines: list[str]) -> None:
    """The long line cut with its marker, then all 1,000 numbered lines, then the odd ones, in order."""
    (big,) = [t for t in lines if t.startswith("big:")]
    m = re.fullmatch(r"big:(x+) … \[cut (\d+) bytes\]", big)
    assert m, big[:100] + "…" + big[-100:]
    kept, dropped = len(m.group(1)), int(m.group(2))
    assert kept + 4 == MAX_LINE and kept + 4 + dropped == BIG + 4
    numbered = [t for t in lines if re.fullmatch(r"n \d{4}", t)]
    assert numbered == [f"n {i:04d}" for i in range(COUNT)]
    assert lines.index(big) < lines.index("n 0000")
    assert "bad \ufffd\ufffd utf8" in lines                   # invalid UTF-8: U+FFFD, as before
    assert "nul a\u2400b end" in lines                        # NUL shown, the line not cut at it
    assert "esc \u241b[31mred\u241b[0m \u241b]0;title\u2407 cr\u240dback\u2408 del\u2421 done" in lines
    assert lines[-1] == "last line"


def _arrived(what: str, out: str, err: str) -> None:
    """check_all_arrived on a command's output, saying which command and what it said when it fails."""
    try:
        check_all_arrived(texts(out))
    except AssertionError as e:
        raise AssertionError(f"{what}: {str(e)[:2000]}\nstderr: {err[-2000:]}\nstdout tail: {out[-1000:]}") from None


def _arrived_in_the_dashboard(project: Path) -> None:
    """The dashboard's run feed (the same reads as ``logs -f``) gets the cut line and every line after it."""
    import asyncio

    import anyio

    from higgsfield.control.backends import backend_for
    from higgsfield.control.config.loader import load_config
    from higgsfield.control.ui.runfeed import RunFeed

    async def main() -> list[str]:
        cfg = load_config(project / "higgsfield.yml")
        async with backend_for(cfg).session() as session, anyio.create_task_group() as tasks:
            feed = RunFeed(session, await session.find("big"), lambda f: None, tasks)
            feed.subscribe()
            deadline = time.monotonic() + 60
            while not feed.logs_done and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await feed.close()
            assert feed.logs_done and not feed.errors, feed.errors
            return [text for _node, rank, text, _at in feed.lines if rank == 0]

    check_all_arrived([inert(t) for t in asyncio.run(main())])   # the page shows text; inert() as the CLI does


def _wait_run_dir(project: Path, run: str, timeout: float = 60) -> Path:
    rd = project.parent / "state" / "runs" / "localproj" / run
    deadline = time.monotonic() + timeout
    while not (rd / "run.json").exists():
        assert time.monotonic() < deadline, "the run never started"
        time.sleep(0.1)
    return rd


def _on_pty(argv: list[str], cwd: Path, timeout: float = 120) -> bytes:
    """``argv``'s output written to a terminal (a pty in raw mode: bytes as the program wrote them)."""
    master, slave = os.openpty()
    tty.setraw(slave)
    proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=slave,  # noqa: S603
                            stderr=subprocess.PIPE, env=_env())
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 1 << 16)
                except OSError:   # EIO: every writer closed the terminal
                    break
                if not data:
                    break
                out += data
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
        proc.kill()
        proc.wait()
    return bytes(out)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_10mib_line_then_1000_lines_arrive_in_run_logs_and_logs_follow(project: Path) -> None:
    follower: subprocess.Popen[str] | None = None
    runner = subprocess.Popen([sys.executable, "-m", "higgsfield", "run", "loud", "-p", "pause=3",  # noqa: S603
                               "--run-name", "big"], cwd=project, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, encoding="utf-8", env=_env())
    try:
        _wait_run_dir(project, "big")
        follower = subprocess.Popen([sys.executable, "-m", "higgsfield", "logs", "big", "-f"],  # noqa: S603
                                    cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    encoding="utf-8", env=_env())
        run_out, run_err = runner.communicate(timeout=180)
        follow_out, follow_err = follower.communicate(timeout=60)
    finally:
        for p in (runner, follower):
            if p is not None and p.poll() is None:
                p.kill()
    assert runner.returncode == 0, run_err[-3000:]
    assert "lost the log stream" not in run_err and "Separator" not in run_err, run_err[-3000:]
    _arrived("run", run_out, run_err)
    assert follower.returncode == 0, follow_err[-3000:]
    _arrived("logs -f", follow_out, follow_err)
    r = hf(project, "logs", "big")
    assert r.returncode == 0, r.stderr[-3000:]
    _arrived("logs", r.stdout, r.stderr)
    _arrived_in_the_dashboard(project)
    # the node's log keeps every byte: the cut is only what is shown
    log = project.parent / "state" / "runs" / "localproj" / "big" / "logs" / "rank0.log"
    assert log.stat().st_size > BIG and b"\x1b]0;title\x07" in log.read_bytes()

    # on a terminal: the rank's escapes are inert; the only escapes are the CLI's own colours of the tags
    raw = _on_pty([sys.executable, "-m", "higgsfield", "logs", "big"], project)
    assert b"\x07" not in raw and b"\r" not in raw and b"\x08" not in raw and b"\x00" not in raw
    shown = raw.decode("utf-8")
    own = re.compile(r"\x1b\[\d+m")
    assert "\x1b" not in own.sub("", shown)
    lines = texts(shown)
    check_all_arrived(lines)
    assert any(line.startswith("\x1b[") for line in shown.split("\n") if "localhost/0" in line)  # coloured tags


def test_inert_shows_every_terminal_control_and_keeps_tab() -> None:
    assert inert("a\x1b[31mb\x1b]0;t\x07c\rd\be\tf\x00g\x7fh\x9bi") == \
        "a\u241b[31mb\u241b]0;t\u2407c\u240dd\u2408e\tf\u2400g\u2421h\\x9bi"
    assert inert("plain ünïcode ✓") == "plain ünïcode ✓"
    assert inert("lone \udcff") == "lone \ufffd"     # a JSON "\\udcff" name: printable, not a crash
    assert "\n" not in inert("two\nlines")


def test_names_from_a_node_are_inert_in_the_kill_and_status_tables() -> None:
    # a run directory or node name on disk with ESC/OSC bytes: kill's and status's rows go through clean()
    name = "evil\x1b]0;pwned\x07\x1b[2J"
    assert clean(name) == "evil\u241b]0;pwned\u2407\u241b[2J"
    assert not re.search(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]", clean(name))


# -- through a real sshd (the test bed): remote/ssh.py's reader ------------------------------------


def _node_run(c, i: int, run: str) -> Path:  # type: ignore[no-untyped-def]
    """A finished run on node ``i`` whose rank 0 printed the 10 MiB line and the rest (files as a run leaves them)."""
    from higgsfield.contract.codec import encode
    from higgsfield.contract.runspec import RunSpec
    from higgsfield.node.state.home import NodeState
    from higgsfield.node.state.records import RunDir, RunRecord

    node = c.nodes[i]
    rd = RunDir(NodeState(c.home(i) / ".hfrt"), "hfrt", run)
    rd.make()
    now = time.time()
    (rd.path / "spec.json").write_text(json.dumps(encode(RunSpec(
        project="hfrt", experiment="loud", run=run, module="loud", code_dir="/nonexistent", params={},
        node=node, node_rank=0, nodes=(node,), master_addr="127.0.0.1", submitted_at=now))))
    rd.write(RunRecord(project="hfrt", experiment="loud", run=run, node=node, node_rank=0, nnodes=1, nproc=1,
                       state="succeeded", exit_code=0, created_at=now, started_at=now, ended_at=now))
    body = [b"big:" + b"x" * BIG + b"\n", *(f"n {k:04d}\n".encode() for k in range(COUNT)),
            b"bad \xff\xfe utf8\n", b"nul a\x00b end\n",
            b"esc \x1b[31mred\x1b[0m \x1b]0;title\x07 cr\rback\x08 del\x7f done\n", b"last line\n"]
    rd.rank_log(0).write_bytes(b"".join(body))
    pw = pwd.getpwnam(node)
    for p in [rd.path.parent.parent, rd.path.parent, rd.path, *rd.path.rglob("*")]:
        os.chown(p, pw.pw_uid, pw.pw_gid)
    return rd.path


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_10mib_line_then_1000_lines_arrive_through_ssh(cluster) -> None:  # type: ignore[no-untyped-def]
    import shutil

    run = f"loud-ssh-{os.getpid()}"
    path = _node_run(cluster, 0, run)
    try:
        r = cluster.hf("logs", run, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        lines = [re.sub(r"^hfnode0/0 \| ", "", line) for line in r.stdout.split("\n")
                 if line.startswith("hfnode0/0 | ")]
        check_all_arrived(lines)
    finally:
        shutil.rmtree(path, ignore_errors=True)

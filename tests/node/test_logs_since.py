"""``logs --since``: the entrypoint's tee (every byte, a time index), reading from a time, parsing T."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from higgsfield.contract.codec import encode
from higgsfield.contract.runspec import RunSpec
from higgsfield.node.observe.logindex import start_offset
from higgsfield.node.observe.logs import read_lines
from higgsfield.node.state.home import NodeState
from higgsfield.node.state.records import RunDir

REPO = Path(__file__).resolve().parents[2]

CHATTY = '''
import os, sys, time
from higgsfield.experiment import experiment, param

@experiment("chatty")
@param("lines", default=20000)
@param("pause", default=0.0)
@param("end", default="kill9")
def chatty(params):
    for i in range(params.lines):
        print(f"line {i} " + "x" * 60)
        if i == params.lines // 2:
            print(f"stderr {i}", file=sys.stderr)
            time.sleep(params.pause)
    sys.stdout.write("tail without newline")
    sys.stdout.flush()
    if params.end == "kill9":
        os.kill(os.getpid(), 9)
    if params.end == "sleep":
        time.sleep(120)
'''


def _expected(lines: int) -> bytes:
    out = []
    for i in range(lines):
        out.append(f"line {i} " + "x" * 60 + "\n")
        if i == lines // 2:
            out.append(f"stderr {i}\n")
    return "".join(out).encode() + b"tail without newline"


def _spawn(tmp_path: Path, params: dict[str, object], **kw: object) -> tuple[subprocess.Popen[bytes], Path]:
    code = tmp_path / "code"
    (code / "src").mkdir(parents=True, exist_ok=True)
    (code / "src" / "chatty.py").write_text(CHATTY)
    rd = tmp_path / "rd"
    (rd / "logs").mkdir(parents=True, exist_ok=True)
    (rd / "spec.json").write_text(json.dumps(encode(RunSpec(
        project="p", experiment="chatty", run="r", module="chatty", code_dir=str(code), params=params,
        node="n", node_rank=0, nodes=("n",), master_addr="127.0.0.1", submitted_at=time.time()))))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PROJECT_NAME="p", EXPERIMENT_NAME="chatty", RUN_NAME="r", PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "higgsfield.node.entrypoint", str(rd)], env=env,  # noqa: S603
                            start_new_session=True, **kw)  # type: ignore[call-overload]
    return proc, rd


def _drained(log: Path, timeout: float = 20) -> None:
    """Wait until no tee holds the index (what ``read_lines`` waits for when following)."""
    from higgsfield.node.observe.logs import _teeing

    rd = _rundir(log.parent.parent)
    deadline = time.time() + timeout
    while _teeing(rd) and time.time() < deadline:
        time.sleep(0.05)
    assert not _teeing(rd), "the tee did not exit"


def test_tee_keeps_every_byte_when_the_worker_is_sigkilled_mid_output(tmp_path: Path) -> None:
    n = 20000  # ~1.4 MB: far more than a pipe holds, so the worker blocks on it and dies with a backlog
    r_extra, w_extra = os.pipe()  # an fd the worker inherits: the tee must not keep it
    proc, rd = _spawn(tmp_path, {"lines": n}, pass_fds=(w_extra,))
    os.close(w_extra)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    os.set_blocking(r_extra, False)
    time.sleep(0.2)
    try:
        assert os.read(r_extra, 1) == b"", "a process (the tee?) still holds an fd the worker inherited"
    except BlockingIOError:
        pytest.fail("a process (the tee?) still holds an fd the worker inherited")
    finally:
        os.close(r_extra)
    log = rd / "logs" / "rank0.log"
    _drained(log)
    assert log.read_bytes() == _expected(n)
    assert int((rd / "logs" / "rank0.pid").read_text()) == proc.pid   # the worker's pid, not the tee's
    entries = [line.split() for line in (rd / "logs" / "rank0.idx").read_text().splitlines()]
    assert entries and entries[0][0] == "0" and abs(float(entries[0][1]) - time.time()) < 60
    # and the reader gets every line, the last one without its newline
    lines = [text for _, text in read_lines(_rundir(rd))]
    assert len(lines) == n + 2 and lines[-1] == "tail without newline"


def _rundir(path: Path) -> RunDir:
    rd = RunDir.__new__(RunDir)
    rd.path = path
    return rd


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def test_the_tee_ignores_sigterm_drains_and_dies_with_its_group_on_sigkill(tmp_path: Path) -> None:
    proc, rd = _spawn(tmp_path, {"lines": 10, "end": "sleep"})
    log = rd / "logs" / "rank0.log"
    deadline = time.time() + 30
    while b"tail without newline" not in (log.read_bytes() if log.exists() else b"") and time.time() < deadline:
        time.sleep(0.05)
    (tee,) = _children(proc.pid)
    assert os.getpgid(tee) == os.getpgid(proc.pid) == proc.pid
    os.killpg(proc.pid, signal.SIGTERM)       # what torchrun sends a worker's group
    assert proc.wait(timeout=30) == -signal.SIGTERM
    _drained(log)                              # survived the SIGTERM, then ended at EOF
    assert not _alive(tee)
    assert log.read_bytes() == _expected(10)
    # SIGKILL of the group ends the tee too
    proc, rd = _spawn(tmp_path, {"lines": 10, "end": "sleep"})
    deadline = time.time() + 30
    while not _children(proc.pid) and time.time() < deadline:
        time.sleep(0.05)
    (tee,) = _children(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.time() + 10
    while _alive(tee) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(tee)


def test_index_entries_are_line_starts_about_a_second_apart(tmp_path: Path) -> None:
    proc, rd = _spawn(tmp_path, {"lines": 200, "pause": 1.5, "end": "exit"})
    assert proc.wait(timeout=60) == 0
    log = rd / "logs" / "rank0.log"
    _drained(log)
    data = log.read_bytes()
    idx = (rd / "logs" / "rank0.idx").read_text().splitlines()
    entries = [(int(o), float(t)) for o, t in (x.split() for x in idx)]
    assert len(entries) >= 2
    for (o1, t1), (o2, t2) in zip(entries, entries[1:], strict=False):
        assert o1 < o2 and t2 - t1 >= 1.0
    for off, _ in entries:
        assert off == 0 or data[off - 1:off] == b"\n"
    # the line after the pause is the first of the second entry
    assert data[entries[1][0]:].startswith(b"line 101 ")
    # --since the middle: from there on, the earlier half not at all
    lines = [text for _, text in read_lines(_rundir(rd), since=entries[1][1] - 0.2)]
    assert lines[0].startswith("line 101 ") and lines[-1] == "tail without newline"


# -- reading from a time, on a synthetic log + index ---------------------------------------------

def _synthetic(tmp_path: Path) -> tuple[RunDir, Path]:
    rd = _rundir(tmp_path / "run")
    rd.logs.mkdir(parents=True)
    log = rd.logs / "rank0.log"
    log.write_bytes(b"a1\na2\nb1\nb2\nc1\nc2")          # a*: t=100, b*: t=110, c*: t=120 (c2 unfinished)
    (rd.logs / "rank0.idx").write_text("0 100.000\n6 110.000\n12 120.000\n13")  # a torn last entry
    os.utime(log, (121, 121))
    launcher = rd.logs / "launcher.log"
    launcher.write_text("torchrun says hi\n")
    os.utime(launcher, (50, 50))
    return rd, log


def _read(rd: RunDir, **kw: object) -> list[tuple[int | None, str]]:
    return list(read_lines(rd, **kw))  # type: ignore[arg-type]


@pytest.mark.parametrize("since,first", [(60, "a1"), (100.5, "a1"), (101, "b1"), (105, "b1"), (111.5, "c1"),
                                         (120.9, "c1")])
def test_since_starts_at_the_first_line_that_may_be_as_new(tmp_path: Path, since: float, first: str) -> None:
    rd, _ = _synthetic(tmp_path)
    got = _read(rd, since=since)
    assert got[0] == (0, first) and got[-1] == (0, "c2")
    assert all(rank == 0 for rank, _ in got)          # the launcher's log is older than since: left out


def test_since_after_the_last_write_shows_nothing_but_what_comes_later(tmp_path: Path) -> None:
    rd, log = _synthetic(tmp_path)
    assert start_offset(log, 125) == log.stat().st_size
    assert _read(rd, since=125) == []
    # following: what is written from now on shows, the launcher's included
    calls = {"n": 0}

    def is_done() -> bool:  # called before each pass: write after the first one has placed the offsets
        calls["n"] += 1
        if calls["n"] == 2:
            with open(log, "ab") as f:
                f.write(b"\nd1\n")
            with open(rd.logs / "launcher.log", "a") as f:
                f.write("restart\n")
        return calls["n"] > 2

    got = _read(rd, since=125, follow=True, is_done=is_done, poll=0.01)
    assert sorted(got, key=lambda x: x[0] or 0) == [(-1, "restart"), (0, ""), (0, "d1")]


def test_without_since_everything_and_without_index_by_mtime(tmp_path: Path) -> None:
    rd, log = _synthetic(tmp_path)
    assert _read(rd)[0] == (-1, "torchrun says hi") and len(_read(rd)) == 7
    (rd.logs / "rank0.idx").unlink()
    assert start_offset(log, 130) == log.stat().st_size       # unchanged since: nothing
    assert start_offset(log, 110) == 0                        # changed since, no times: all of it
    os.utime(rd.logs / "launcher.log", (200, 200))
    assert (-1, "torchrun says hi") in _read(rd, since=150)


def test_invoker_logs_since(tmp_path: Path) -> None:
    from higgsfield.node.cli import invoker

    rd, _ = _synthetic(tmp_path)
    run = RunDir(NodeState(tmp_path / "state"), "proj", "r1")
    run.path.parent.mkdir(parents=True)
    rd.path.rename(run.path)
    run.record_path.write_text("{}")
    r = CliRunner().invoke(invoker, ["--state-dir", str(tmp_path / "state"), "logs", "--project", "proj",
                                     "--run", "r1", "--since", "111.5"])
    assert r.exit_code == 0, r.output
    assert r.output == "0\tc1\n0\tc2\n"


def test_follow_waits_for_a_tee_still_holding_the_index(tmp_path: Path) -> None:
    import fcntl
    import threading

    rd, log = _synthetic(tmp_path)
    fd = os.open(rd.logs / "rank0.idx", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)          # a tee still draining

    def finish() -> None:
        time.sleep(0.5)
        with open(log, "ab") as f:
            f.write(b"\nlast words\n")
        os.close(fd)

    threading.Thread(target=finish).start()
    got = _read(rd, follow=True, is_done=lambda: True, poll=0.02)
    assert got[-1] == (0, "last words")


# -- parsing T ------------------------------------------------------------------------------------

@pytest.mark.parametrize("value,ago", [("30s", 30), ("10m", 600), ("2h", 7200), ("1d", 86400), ("1.5h", 5400),
                                       (" 45S ", 45)])
def test_since_durations(value: str, ago: float) -> None:
    from higgsfield.control.cli._lines import parse_since

    assert parse_since(value, now=1_000_000.0) == 1_000_000.0 - ago


def test_since_times() -> None:
    from higgsfield.control.cli._lines import parse_since

    assert parse_since("2026-11-30T10:00") == datetime(2026, 11, 30, 10, 0).timestamp()      # local
    assert parse_since("2026-11-30 10:00:30") == datetime(2026, 11, 30, 10, 0, 30).timestamp()
    assert parse_since("2026-11-30T10:00Z") == datetime(2026, 11, 30, 10, 0, tzinfo=timezone.utc).timestamp()
    assert parse_since("2026-11-30") == datetime(2026, 11, 30).timestamp()


@pytest.mark.parametrize("value", ["", "yesterday", "10x", "-5m", "m", "2026-13-01", "10:00:00 tomorrow"])
def test_bad_since_values(value: str) -> None:
    from higgsfield.control.cli._lines import parse_since

    with pytest.raises(click.BadParameter, match="neither a duration"):
        parse_since(value)


def test_bad_since_is_a_usage_error_before_anything_else(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "higgsfield", "logs", "someexp", "--since", "soon"],  # noqa: S603
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "Invalid value for '--since': 'soon' is neither a duration ago (30s, 10m, 2h, 1d)" in r.stderr

"""Transports read lines in chunks: a 10 MiB line is cut with a marker and the stream goes on.

Real pipes: a subprocess (LocalTransport) and an in-process asyncssh server (SSHTransport).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
from pathlib import Path

import pytest
from sshserver import FakeServer, fake_server

from higgsfield.contract.text import LineSplitter, cut_marker
from higgsfield.control.remote.base import WIRE_LINE, Timeouts
from higgsfield.control.remote.hostkeys import PinnedHosts
from higgsfield.control.remote.local import LocalTransport
from higgsfield.control.remote.ssh import SSHTransport

BIG = 10 << 20
PRINTER = ("import sys; o = sys.stdout.buffer; o.write(b'big:' + b'x' * (10 << 20) + b'\\n')\n"
           "for i in range(1000): o.write(b'n %04d\\n' % i)\n"
           "o.write(b'nul a\\x00b\\n'); o.write(b'no newline at the end')")


def _payload() -> bytes:
    return (b"big:" + b"x" * BIG + b"\n" + b"".join(b"n %04d\n" % i for i in range(1000))
            + b"nul a\x00b\n" + b"no newline at the end")


def _check(lines: list[str]) -> None:
    assert len(lines) == 1003
    m = re.fullmatch(r"big:(x+) … \[cut (\d+) bytes\]", lines[0])
    assert m and len(m.group(1)) + 4 == WIRE_LINE and WIRE_LINE + int(m.group(2)) == BIG + 4
    assert lines[1:1001] == [f"n {i:04d}" for i in range(1000)]
    assert lines[1001:] == ["nul a\x00b", "no newline at the end"]


@pytest.mark.timeout(60)
def test_local_stream_takes_a_10mib_line_and_every_line_after_it() -> None:
    async def main() -> list[str]:
        t = LocalTransport()
        return [line async for line in t.stream([sys.executable, "-c", PRINTER])]

    _check(asyncio.run(main()))


@pytest.mark.timeout(60)
def test_local_session_receives_past_a_10mib_line() -> None:
    async def main() -> tuple[list[str], str]:
        t = LocalTransport()
        async with t.session([sys.executable, "-c", PRINTER]) as s:
            got = [await s.receive() for _ in range(1002)]
            result = await s.finish()
        return [g for g in got if g is not None], result.stdout

    lines, rest = asyncio.run(main())
    _check([*lines, rest])      # what was not received is finish()'s stdout


def _ssh(srv: FakeServer, tmp: Path) -> SSHTransport:
    known = tmp / "known_hosts"
    PinnedHosts(known).pin(srv.host, srv.port, srv.host_key.convert_to_public(), comment="higgsfield:n1")
    return SSHTransport("n1", srv.host, user="tester", port=srv.port, identity_file=str(srv.client_key_path),
                        pins=PinnedHosts(known), timeouts=Timeouts(connect=5, command=30, retries=0))


@pytest.mark.timeout(60)
def test_ssh_stream_takes_a_10mib_line_and_every_line_after_it(tmp_path: Path) -> None:
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen (OpenSSH client) is not installed")

    async def main() -> list[str]:
        async with fake_server(tmp_path) as srv:
            t = _ssh(srv, tmp_path)
            try:
                return [line async for line in t.stream(["cat"], input=_payload())]
            finally:
                await t.close()

    _check(asyncio.run(main()))


def test_splitter_cuts_at_a_character_boundary_and_says_how_much() -> None:
    s = LineSplitter(10)
    assert s.feed("123456789€tail\n".encode()) == ["123456789" + cut_marker(len("€tail".encode()))]
    assert s.feed(b"\xff ok\n") == ["\ufffd ok"]


def test_splitter_memory_is_bounded_without_newlines() -> None:
    s = LineSplitter(100)
    for _ in range(1000):
        assert s.feed(b"y" * 10_000) == []
    assert len(s._head) == 100 and s.pending
    assert s.feed(b"\nnext\n") == ["y" * 100 + cut_marker(10_000_000 - 100), "next"]
    assert s.end() == [] and not s.pending


def test_splitter_lines_split_across_chunks_and_empty_lines() -> None:
    s = LineSplitter()
    out: list[str] = []
    for byte in b"a\n\nbc\nd":
        out += s.feed(bytes([byte]))
    assert out == ["a", "", "bc"] and s.end() == ["d"]

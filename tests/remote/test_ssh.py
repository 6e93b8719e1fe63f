"""SSHTransport against an in-process asyncssh server: host keys verified, quoting, timeouts, SFTP."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import asyncssh
import pytest
from sshserver import FakeServer, closed_port, fake_server, silent_listener

from higgsfield.contract.errors import CommandError, ConnectError, HostKeyError, HostNotPinnedError
from higgsfield.control.remote.base import Timeouts
from higgsfield.control.remote.hostkeys import PinnedHosts, fingerprint
from higgsfield.control.remote.ssh import SSHTransport, build_command


def _keygen() -> str:
    path = shutil.which("ssh-keygen")
    if path is None:
        pytest.skip("ssh-keygen (OpenSSH client) is not installed")
    return path


def _transport(port: int, key: Path, known: Path, *, connect: float = 5, retries: int = 0,
               command: float = 10) -> SSHTransport:
    return SSHTransport("n1", "127.0.0.1", user="tester", port=port, identity_file=str(key),
                        pins=PinnedHosts(known), timeouts=Timeouts(connect=connect, command=command, retries=retries))


def _pinned(known: Path, srv: FakeServer) -> Path:
    """``known`` with ``srv``'s key pinned, as ``higgsfield setup`` leaves it."""
    PinnedHosts(known).pin(srv.host, srv.port, srv.host_key.convert_to_public(), comment="higgsfield:n1")
    return known


def test_build_command_quotes_every_argument() -> None:
    assert build_command(["echo", "a b", "$HOME", "it's"]) == "echo 'a b' '$HOME' 'it'\"'\"'s'"
    with pytest.raises(ValueError):
        build_command([])


def test_unpinned_node_is_refused_before_authentication_and_nothing_is_pinned(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"

    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            t = _transport(srv.port, srv.client_key_path, known, retries=2)
            start = time.monotonic()
            with pytest.raises(HostNotPinnedError) as err:
                await t.run(["cat"], input="s3cret")
            assert time.monotonic() - start < 3  # not retried
            with pytest.raises(HostNotPinnedError):  # remembered: no second handshake
                await t.put_bytes(b"s3cret", "token")
            assert len(srv.connections) == 1
            assert srv.auths == [] and srv.commands == [] and srv.sftp_sessions == []  # never even logged in
            assert not known.exists() and t.fingerprint is None
            msg = str(err.value)
            assert msg == (f"n1: [127.0.0.1]:{srv.port} offers host key {fingerprint(srv.host_key)}, which is not "
                           f"pinned in {known}: refusing to connect; run 'higgsfield setup' to check the "
                           "fingerprint and pin it, then commit the file")
            assert isinstance(err.value, HostKeyError)
            await t.close()

    asyncio.run(main())


def test_pinned_key_verifies_and_nothing_is_written(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"

    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            _pinned(known, srv)
            subprocess.run([_keygen(), "-H", "-f", str(known)], check=True, capture_output=True)  # hashed entries too
            known.with_name("known_hosts.old").unlink()
            assert known.read_text().startswith("|1|")
            before = known.read_bytes()
            t = _transport(srv.port, srv.client_key_path, known)
            r = await t.run(["echo", "a b", "$HOME"])
            assert r.stdout == "echo 'a b' '$HOME'\n"
            assert t.fingerprint == fingerprint(srv.host_key)
            assert srv.auths == ["tester"] and len(srv.connections) == 1  # what the refusals above never reach
            await t.close()
            await t.close()  # idempotent
            assert known.read_bytes() == before

    asyncio.run(main())


def test_changed_host_key_is_refused_before_any_command(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"

    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            port = srv.port
            _pinned(known, srv)
            old = fingerprint(srv.host_key)
        before = known.read_bytes()
        async with fake_server(tmp_path, port=port) as srv2:  # same address, new host key
            t = _transport(port, srv2.client_key_path, known, retries=2)
            start = time.monotonic()
            with pytest.raises(HostKeyError) as err:
                await t.run(["echo", "should-not-run"])
            assert time.monotonic() - start < 3  # not retried
            assert not isinstance(err.value, HostNotPinnedError)
            assert srv2.commands == [] and srv2.auths == []
            msg = str(err.value)
            assert msg.startswith(f"n1: host key of [127.0.0.1]:{port} changed: it offers "
                                  f"{fingerprint(srv2.host_key)}, but {known} pins {old}. ")
            assert "higgsfield setup --repin n1" in msg
            assert known.read_bytes() == before

    asyncio.run(main())


def test_trusted_keys_connect_without_writing_a_pin(tmp_path: Path) -> None:
    """What a ``setup --dry-run`` does with a key the user accepted: use it, write nothing."""
    known = tmp_path / "known_hosts"

    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            t = SSHTransport("n1", "127.0.0.1", user="tester", port=srv.port, identity_file=str(srv.client_key_path),
                             pins=PinnedHosts(known), trusted=[srv.host_key.convert_to_public()])
            assert (await t.run(["true"])).ok and t.fingerprint == fingerprint(srv.host_key)
            await t.close()
            other = asyncssh.generate_private_key("ssh-ed25519").convert_to_public()
            t2 = SSHTransport("n1", "127.0.0.1", user="tester", port=srv.port,
                              identity_file=str(srv.client_key_path), pins=PinnedHosts(known), trusted=[other])
            with pytest.raises(HostKeyError, match="changed"):
                await t2.run(["true"])
        assert not known.exists()

    asyncio.run(main())


def test_scan_host_key_fetches_the_key_without_logging_in(tmp_path: Path) -> None:
    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            t = _transport(srv.port, srv.client_key_path, tmp_path / "kh")
            key = await t.scan_host_key()
            assert fingerprint(key) == fingerprint(srv.host_key)
            assert len(srv.connections) == 1 and srv.auths == [] and srv.commands == []
        gone = _transport(closed_port(), tmp_path / "nokey", tmp_path / "kh", connect=1, retries=1)
        with pytest.raises(ConnectError, match="cannot connect to tester@127.0.0.1.*2 attempts"):
            await gone.scan_host_key()
        assert not (tmp_path / "kh").exists()

    asyncio.run(main())


def test_a_failed_connection_is_remembered_until_close(tmp_path: Path) -> None:
    key = tmp_path / "k"
    key.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())

    async def main() -> None:
        t = _transport(closed_port(), key, tmp_path / "kh", connect=1, retries=1)
        start = time.monotonic()
        with pytest.raises(ConnectError) as first:
            await t.connect()
        assert time.monotonic() - start >= 0.4  # one backoff
        start = time.monotonic()
        with pytest.raises(ConnectError) as again:
            await t.run(["true"])
        assert again.value is first.value and time.monotonic() - start < 0.2  # not paid twice
        await t.close()
        start = time.monotonic()
        with pytest.raises(ConnectError):
            await t.run(["true"])
        assert time.monotonic() - start >= 0.4  # after close: a fresh attempt, with its retries

    asyncio.run(main())


def test_command_failure_timeout_and_stdin(tmp_path: Path) -> None:
    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            t = _transport(srv.port, srv.client_key_path, _pinned(tmp_path / "kh", srv))
            r = await t.run(["exit", "3"], check=False)
            assert r.exit_status == 3 and "failing with 3" in r.stderr
            with pytest.raises(CommandError, match="exited 3: failing with 3"):
                await t.run(["exit", "3"])
            assert (await t.run(["cat"], input="secret\n")).stdout == "secret\n"
            start = time.monotonic()
            with pytest.raises(CommandError, match="timed out after 0.5s"):
                await t.run(["sleep", "30"], timeout=0.5)
            assert time.monotonic() - start < 3
            assert [ln async for ln in t.stream(["cat"], input="a\nb\n")] == ["a", "b"]
            await t.close()
            # one failing command is never retried
            assert sum(1 for c in srv.commands if c == "exit 3") == 2

    asyncio.run(main())


def test_put_bytes_is_atomic_with_mode(tmp_path: Path) -> None:
    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            t = _transport(srv.port, srv.client_key_path, _pinned(tmp_path / "kh", srv))
            await t.put_bytes(b"k3y", "dir/sub/key", mode=0o600)
            src = tmp_path / "local.bin"
            src.write_bytes(b"x" * 3_000_000)
            await t.put_file(str(src), "dir/big.bin", mode=0o644)
            await t.close()
        target = srv.root / "dir" / "sub" / "key"
        assert target.read_bytes() == b"k3y"
        assert target.stat().st_mode & 0o777 == 0o600
        assert (srv.root / "dir" / "big.bin").stat().st_size == 3_000_000
        assert (srv.root / "dir" / "big.bin").stat().st_mode & 0o777 == 0o644
        assert [p.name for p in (srv.root / "dir" / "sub").iterdir()] == ["key"]  # no temp file left

    asyncio.run(main())


def test_get_file_copies_in_parallel_resumes_from_an_offset_and_stops_at_end(tmp_path: Path) -> None:
    """pull's copy: many blocks in flight (asyncssh's read_parallel), written at their offsets."""
    data = bytes(range(256)) * 40_000   # 10 MB: many blocks, in any order
    seen: list[int] = []

    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            (srv.root / "big.bin").write_bytes(data)
            t = _transport(srv.port, srv.client_key_path, _pinned(tmp_path / "kh", srv))
            whole = tmp_path / "whole.bin"
            await t.get_file("big.bin", str(whole), progress=seen.append)
            assert whole.read_bytes() == data and sum(seen) == len(data)
            cut = tmp_path / "cut.bin"
            cut.write_bytes(data[:3_000_001] + b"junk past the offset")
            await t.get_file("big.bin", str(cut), offset=3_000_001)
            assert cut.read_bytes() == data
            part = tmp_path / "part.bin"
            await t.get_file("big.bin", str(part), offset=0, end=5_000_000)
            assert part.read_bytes() == data[:5_000_000]
            # stopped midway (here: by its progress callback): cut back to bytes all there, then resumed
            stopped = tmp_path / "stopped.bin"
            calls: list[int] = []

            assert len(seen) >= 2, seen   # blocks (asyncssh hands them on in runs of up to 4 MiB), not one read

            def stop_halfway(n: int) -> None:
                calls.append(n)
                if len(calls) == len(seen) // 2:
                    raise KeyboardInterrupt

            with pytest.raises(KeyboardInterrupt):
                await t.get_file("big.bin", str(stopped), progress=stop_halfway)
            size = stopped.stat().st_size
            assert size < len(data) and stopped.read_bytes() == data[:size]
            await t.get_file("big.bin", str(stopped), offset=size)
            assert stopped.read_bytes() == data
            with pytest.raises(CommandError, match="cannot read missing.bin"):
                await t.get_file("missing.bin", str(tmp_path / "none.bin"))
            await t.close()

    asyncio.run(main())


def test_an_interrupted_copy_keeps_only_its_gapless_prefix() -> None:
    from higgsfield.control.remote.ssh import _Prefix

    p = _Prefix(100)
    for pos, size in ((150, 50), (300, 10), (100, 50)):   # out of order: 100..200 whole, 300..310 past a gap
        p.add(pos, size)
    assert p.end == 200
    p.add(200, 100)
    assert p.end == 310


def test_connect_timeout_names_node_and_is_bounded(tmp_path: Path) -> None:
    async def main() -> None:
        async with silent_listener() as port:
            t = _transport(port, tmp_path / "nokey", tmp_path / "kh", connect=0.5, retries=1)
            (tmp_path / "nokey").write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
            start = time.monotonic()
            with pytest.raises(ConnectError) as err:
                await t.run(["true"])
            spent = time.monotonic() - start
            assert "n1: connect timed out after 0.5s" in str(err.value)
            assert "2 attempts" in str(err.value)
            assert spent < 0.5 * 2 + 0.5 + 2  # two attempts + one backoff, with slack

    asyncio.run(main())


def test_refused_connection_is_retried_with_backoff(tmp_path: Path) -> None:
    key = tmp_path / "k"
    key.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())

    async def main() -> None:
        t = _transport(closed_port(), key, tmp_path / "kh", connect=1, retries=2)
        start = time.monotonic()
        with pytest.raises(ConnectError) as err:
            await t.run(["true"])
        spent = time.monotonic() - start
        assert "cannot connect to tester@127.0.0.1" in str(err.value) and "3 attempts" in str(err.value)
        assert 1.4 <= spent < 5  # backoff 0.5 + 1.0

    asyncio.run(main())


def test_authentication_failure_is_not_retried(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())

    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            t = _transport(srv.port, other, _pinned(tmp_path / "kh", srv), retries=3)
            start = time.monotonic()
            with pytest.raises(ConnectError, match="authentication failed as tester@127.0.0.1"):
                await t.run(["true"])
            assert time.monotonic() - start < 3

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["encrypted", "garbage"])
def test_unusable_identity_file_is_a_connect_error(tmp_path: Path, kind: str) -> None:
    key = tmp_path / "id"
    if kind == "encrypted":
        subprocess.run([_keygen(), "-q", "-t", "ed25519", "-N", "pw", "-f", str(key)], check=True)
    else:
        key.write_text("not a key\n")

    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            t = _transport(srv.port, key, _pinned(tmp_path / "kh", srv), retries=2)
            with pytest.raises(ConnectError) as err:
                await t.run(["true"])
            msg = str(err.value)
            assert msg.startswith(f"n1: cannot load identity_file {key}: ")
            assert "add the key to ssh-agent and omit identity_file, or use an unencrypted key" in msg

    asyncio.run(main())


def test_cancelled_run_and_abandoned_stream_close_the_remote_command(tmp_path: Path) -> None:
    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            t = _transport(srv.port, srv.client_key_path, _pinned(tmp_path / "kh", srv))
            task = asyncio.create_task(t.run(["hang"]))
            await _until(lambda: "hang" in srv.commands)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await _until(lambda: srv.closed == ["hang"])
            stream = t.stream(["hang", "2"])
            consume = asyncio.create_task(anext(stream))  # type: ignore[arg-type]
            await _until(lambda: "hang 2" in srv.commands)
            consume.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consume
            await stream.aclose()  # type: ignore[attr-defined]
            await _until(lambda: srv.closed == ["hang", "hang 2"])
            with pytest.raises(CommandError, match="timed out"):
                await t.run(["hang", "3"], timeout=0.3)
            await _until(lambda: srv.closed == ["hang", "hang 2", "hang 3"])
            assert (await t.run(["true"])).ok  # the connection is still usable
            await t.close()

    asyncio.run(main())


def test_lost_connection_is_closed_not_just_dropped(tmp_path: Path) -> None:
    class Broken:
        aborted = False

        async def create_process(self, *a: object, **k: object) -> None:
            raise asyncssh.ConnectionLost("gone")

        def abort(self) -> None:
            Broken.aborted = True

    async def main() -> None:
        t = _transport(1, tmp_path / "k", tmp_path / "kh")
        t._conn = Broken()  # type: ignore[assignment]
        with pytest.raises(CommandError, match="connection lost while running 'true'"):
            await t.run(["true"])
        assert Broken.aborted and t._conn is None

    asyncio.run(main())


async def _until(cond: Callable[[], bool], limit: float = 3.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)

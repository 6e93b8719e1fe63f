"""SSHTransport against an in-process asyncssh server: pinning, refusal, quoting, timeouts, SFTP."""

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
from sshserver import closed_port, fake_server, silent_listener

from higgsfield.config import Config
from higgsfield.errors import CommandError, ConnectError, HostKeyError, HostNotPinnedError
from higgsfield.remote.base import Timeouts
from higgsfield.remote.fanout import transport_for
from higgsfield.remote.hostkeys import PinnedHosts, fingerprint
from higgsfield.remote.ssh import SSHTransport, build_command


def _keygen() -> str:
    path = shutil.which("ssh-keygen")
    if path is None:
        pytest.skip("ssh-keygen (OpenSSH client) is not installed")
    return path


def _transport(port: int, key: Path, known: Path, *, connect: float = 5, retries: int = 0,
               command: float = 10, writable: bool = True) -> SSHTransport:
    return SSHTransport("n1", "127.0.0.1", user="tester", port=port, identity_file=str(key),
                        pins=PinnedHosts(known, writable=writable),
                        timeouts=Timeouts(connect=connect, command=command, retries=retries))


def test_build_command_quotes_every_argument() -> None:
    assert build_command(["echo", "a b", "$HOME", "it's"]) == "echo 'a b' '$HOME' 'it'\"'\"'s'"
    with pytest.raises(ValueError):
        build_command([])


def test_first_contact_pins_then_verifies(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"

    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            t = _transport(srv.port, srv.client_key_path, known)
            r = await t.run(["echo", "a b", "$HOME"])
            assert r.stdout == "echo 'a b' '$HOME'\n"
            assert t.pinned_now and t.fingerprint == fingerprint(srv.host_key)
            await t.close()
            await t.close()  # idempotent
            line = known.read_text()
            assert line.startswith(f"[127.0.0.1]:{srv.port} ssh-ed25519 ")
            t2 = _transport(srv.port, srv.client_key_path, known)
            assert (await t2.run(["true"])).ok
            assert not t2.pinned_now and t2.fingerprint == fingerprint(srv.host_key)
            await t2.close()
            assert known.read_text() == line  # nothing appended on a verified contact

    asyncio.run(main())


def test_changed_host_key_is_refused_before_any_command(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"

    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            port = srv.port
            t = _transport(port, srv.client_key_path, known)
            await t.run(["true"])
            await t.close()
        async with fake_server(tmp_path, port=port) as srv2:  # same address, new host key
            t = _transport(port, srv2.client_key_path, known, retries=2)
            start = time.monotonic()
            with pytest.raises(HostKeyError) as err:
                await t.run(["echo", "should-not-run"])
            assert time.monotonic() - start < 3  # not retried
            assert srv2.commands == []
            msg = str(err.value)
            assert "changed" in msg and fingerprint(srv2.host_key) in msg
            assert "higgsfield setup --repin n1" in msg

    asyncio.run(main())


def test_read_only_pins_are_not_written(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"

    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            t = _transport(srv.port, srv.client_key_path, known, writable=False)
            assert (await t.run(["true"])).ok
            assert not t.pinned_now and t.fingerprint == fingerprint(srv.host_key)
            await t.close()
        assert not known.exists()

    asyncio.run(main())


def test_command_failure_timeout_and_stdin(tmp_path: Path) -> None:
    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            t = _transport(srv.port, srv.client_key_path, tmp_path / "kh")
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
            t = _transport(srv.port, srv.client_key_path, tmp_path / "kh")
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
            t = _transport(srv.port, other, tmp_path / "kh", retries=3)
            start = time.monotonic()
            with pytest.raises(ConnectError, match="authentication failed as tester@127.0.0.1"):
                await t.run(["true"])
            assert time.monotonic() - start < 3

    asyncio.run(main())


def test_unpinned_node_is_refused_without_trust_on_first_use(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"

    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            t = SSHTransport("n1", "127.0.0.1", user="tester", port=srv.port,
                             identity_file=str(srv.client_key_path), pins=PinnedHosts(known, tofu=False),
                             timeouts=Timeouts(connect=5, retries=2))
            with pytest.raises(HostNotPinnedError) as err:
                await t.run(["echo", "should-not-run"])
            assert srv.commands == [] and not known.exists()
            assert f"node n1 is not pinned in {known}: run 'higgsfield setup' and commit the file" in str(err.value)
            assert isinstance(err.value, HostKeyError)
            # once pinned (here: hashed, as ssh-keygen -H writes it), the same transport settings connect
            PinnedHosts(known).pin("127.0.0.1", srv.port, srv.host_key.convert_to_public())
            subprocess.run([_keygen(), "-H", "-f", str(known)], check=True, capture_output=True)
            assert known.read_text().startswith("|1|")
            t2 = SSHTransport("n1", "127.0.0.1", user="tester", port=srv.port,
                              identity_file=str(srv.client_key_path), pins=PinnedHosts(known, tofu=False))
            assert (await t2.run(["true"])).ok
            await t2.close()

    asyncio.run(main())


def test_from_config_follows_the_configs_trust_on_first_use(tmp_path: Path) -> None:
    cfg = Config.model_validate({"name": "p", "nodes": [{"host": "gpu-1"}], "ssh": {"user": "u"}})
    cfg.path = tmp_path / "higgsfield.yml"
    assert SSHTransport.from_config(cfg, cfg.nodes[0]).pins.tofu
    assert not SSHTransport.from_config(cfg, cfg.nodes[0], tofu=False).pins.tofu
    ci = cfg.refusing_new_hosts()
    assert cfg.trust_new_hosts and not ci.trust_new_hosts
    assert not SSHTransport.from_config(ci, ci.nodes[0]).pins.tofu
    assert not transport_for(ci, ci.nodes[0]).pins.tofu  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["encrypted", "garbage"])
def test_unusable_identity_file_is_a_connect_error(tmp_path: Path, kind: str) -> None:
    key = tmp_path / "id"
    if kind == "encrypted":
        subprocess.run([_keygen(), "-q", "-t", "ed25519", "-N", "pw", "-f", str(key)], check=True)
    else:
        key.write_text("not a key\n")

    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            t = _transport(srv.port, key, tmp_path / "kh", retries=2)
            with pytest.raises(ConnectError) as err:
                await t.run(["true"])
            msg = str(err.value)
            assert msg.startswith(f"n1: cannot load identity_file {key}: ")
            assert "add the key to ssh-agent and omit identity_file, or use an unencrypted key" in msg

    asyncio.run(main())


def test_cancelled_run_and_abandoned_stream_close_the_remote_command(tmp_path: Path) -> None:
    async def main() -> None:
        async with fake_server(tmp_path) as srv:
            t = _transport(srv.port, srv.client_key_path, tmp_path / "kh")
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

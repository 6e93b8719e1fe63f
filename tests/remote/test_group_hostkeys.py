"""``open_group``: every node's host key is verified before any command runs on any node."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncssh
import pytest
from sshserver import FakeServer, closed_port, fake_server

from higgsfield.contract.errors import ConnectError, HostKeyError, HostNotPinnedError
from higgsfield.control.config import Config
from higgsfield.control.remote.fanout import open_group
from higgsfield.control.remote.hostkeys import PinnedHosts, fingerprint


def _cfg(tmp_path: Path, nodes: list[dict[str, object]], key: Path) -> Config:
    cfg = Config.model_validate({"name": "p", "nodes": nodes,
                                 "ssh": {"user": "tester", "identity_file": str(key), "connect_timeout": 1,
                                         "retries": 1}})
    cfg.path = tmp_path / "higgsfield.yml"
    return cfg


def _pin(cfg: Config, srv: FakeServer, key: asyncssh.SSHKey | None = None) -> None:
    PinnedHosts(cfg.known_hosts_path).pin(srv.host, srv.port, key or srv.host_key.convert_to_public())


@contextlib.asynccontextmanager
async def _servers(tmp_path: Path, n: int) -> AsyncIterator[list[FakeServer]]:
    client_key = asyncssh.generate_private_key("ssh-ed25519")  # one laptop key, authorized on every server
    async with contextlib.AsyncExitStack() as stack:
        servers = []
        for i in range(n):
            d = tmp_path / f"srv{i}"
            d.mkdir()
            servers.append(await stack.enter_async_context(fake_server(d, client_key=client_key)))
        yield servers


def test_one_unpinned_node_refuses_the_whole_group_before_any_command(tmp_path: Path) -> None:
    async def main() -> None:
        async with _servers(tmp_path, 3) as (a, b, c):
            cfg = _cfg(tmp_path, [{"host": "127.0.0.1", "port": s.port, "name": n}
                                  for s, n in ((a, "a"), (b, "b"), (c, "c"))], a.client_key_path)
            _pin(cfg, a)
            _pin(cfg, c, asyncssh.generate_private_key("ssh-ed25519").convert_to_public())  # c: changed
            before = cfg.known_hosts_path.read_bytes()
            ran: list[str] = []
            with pytest.raises(HostKeyError) as err:
                async with open_group(cfg) as group:
                    await group.run(lambda m: m.transport.run(["echo", "hi"]))
                    ran.append("body")
            assert ran == [] and a.commands == b.commands == c.commands == []
            assert b.auths == c.auths == []  # refused before authentication
            assert isinstance(err.value, HostNotPinnedError)  # the first refused node in node order: b
            assert str(err.value).startswith(f"b: [127.0.0.1]:{b.port} offers host key {fingerprint(b.host_key)}, ")
            assert str(err.value).endswith(" (refused too: c)") and "\n" not in str(err.value)
            assert cfg.known_hosts_path.read_bytes() == before
            _pin(cfg, b)  # what setup does once the user accepted b's key, and --repin for c
            PinnedHosts(cfg.known_hosts_path).pin(c.host, c.port, c.host_key.convert_to_public(), replace=True)
            async with open_group(cfg) as group:
                results = await group.run(lambda m: m.transport.run(["echo", "hi"]))
            assert [r.value.stdout for r in results if r.value] == ["echo hi\n"] * 3
            assert b.auths == c.auths == ["tester"] and len(a.auths) == 2  # a: logged in, nothing run, the 1st time

    asyncio.run(main())


def test_a_changed_key_alone_is_a_host_key_error_naming_the_repin(tmp_path: Path) -> None:
    async def main() -> None:
        async with _servers(tmp_path, 1) as (a,):
            cfg = _cfg(tmp_path, [{"host": "127.0.0.1", "port": a.port, "name": "a"}], a.client_key_path)
            _pin(cfg, a, asyncssh.generate_private_key("ssh-ed25519").convert_to_public())
            with pytest.raises(HostKeyError) as err:
                async with open_group(cfg):
                    pass
            assert not isinstance(err.value, HostNotPinnedError)
            assert "changed" in str(err.value) and str(err.value).endswith("higgsfield setup --repin a")

    asyncio.run(main())


def test_an_unreachable_node_is_that_nodes_result_and_its_timeout_is_paid_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with _servers(tmp_path, 1) as (a,):
            cfg = _cfg(tmp_path, [{"host": "127.0.0.1", "port": a.port, "name": "a"},
                                  {"host": "127.0.0.1", "port": closed_port(), "name": "gone"}], a.client_key_path)
            _pin(cfg, a)
            start = time.monotonic()
            async with open_group(cfg) as group:
                opened = time.monotonic() - start
                results = await group.run(lambda m: m.transport.run(["echo", "hi"]))
            spent = time.monotonic() - start
            ok, gone = results
            assert ok.ok and ok.value is not None and ok.value.stdout == "echo hi\n"
            assert isinstance(gone.error, ConnectError) and "2 attempts" in gone.reason
            assert opened >= 0.4 and spent - opened < 0.4  # the step did not retry the connection again

    asyncio.run(main())

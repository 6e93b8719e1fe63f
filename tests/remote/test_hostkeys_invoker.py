"""PinnedHosts file handling and the invoker path helpers."""

from __future__ import annotations

import sys
from pathlib import Path

import asyncssh

from higgsfield.control.config import Config
from higgsfield.control.remote.hostkeys import PinnedHosts, entry_name
from higgsfield.control.remote.invoker import invoker_argv, node_state_dir


def test_pin_lookup_replace(tmp_path: Path) -> None:
    pins = PinnedHosts(tmp_path / ".higgsfield" / "known_hosts")
    k1 = asyncssh.generate_private_key("ssh-ed25519").convert_to_public()
    k2 = asyncssh.generate_private_key("ssh-ed25519").convert_to_public()
    assert pins.lookup("10.0.0.1", 22) == []
    pins.pin("10.0.0.1", 22, k1, comment="higgsfield:a")
    pins.pin("10.0.0.1", 22, k1)  # already pinned: no second line
    pins.pin("10.0.0.1", 2222, k2)
    text = pins.path.read_text()
    assert text.count("\n") == 2 and text.startswith("10.0.0.1 ssh-ed25519 ")
    assert "[10.0.0.1]:2222 ssh-ed25519" in text
    assert pins.lookup("10.0.0.1", 22) == [k1]
    assert pins.lookup("10.0.0.1", 2222) == [k2]  # exact port: no fallback to the port-less entry
    pins.pin("10.0.0.1", 2222, k1, replace=True)
    assert pins.lookup("10.0.0.1", 2222) == [k1] and pins.lookup("10.0.0.1", 22) == [k1]
    # the file is plain OpenSSH format: asyncssh (like ssh) reads it
    assert asyncssh.read_known_hosts(str(pins.path)).match("10.0.0.1", "", None)[0] == [k1]


def test_entry_name() -> None:
    assert entry_name("h", 22) == "h" and entry_name("h", 2201) == "[h]:2201"


def test_invoker_argv_and_state_dir() -> None:
    cfg = Config.model_validate({"name": "p", "nodes": [{"host": "localhost"}, {"host": "gpu-1"}]})
    assert invoker_argv(cfg, cfg.nodes[0])[:4] == [sys.executable, "-m", "higgsfield", "invoker"]
    assert invoker_argv(cfg, cfg.nodes[1])[:2] == [".higgsfield/venv/bin/higgsfield", "invoker"]
    assert node_state_dir(cfg) == ".higgsfield"
    cfg2 = Config.model_validate({"name": "p", "nodes": [{"host": "g"}], "state_dir": "/srv/hf/"})
    assert node_state_dir(cfg2) == "/srv/hf"
    assert invoker_argv(cfg2, cfg2.nodes[0])[:2] == ["/srv/hf/venv/bin/higgsfield", "invoker"]


def _hashed(name: str) -> str:
    import base64
    import hashlib
    import hmac
    import os

    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def test_hashed_entries_match_and_lookup_and_replace_agree(tmp_path: Path) -> None:
    k1, k2, k3 = (asyncssh.generate_private_key("ssh-ed25519").convert_to_public() for _ in range(3))

    def line(host: str, key: asyncssh.SSHKey) -> str:
        return f"{host} {key.export_public_key('openssh').decode().split()[0]} " \
               f"{key.export_public_key('openssh').decode().split()[1]}"

    known = tmp_path / "known_hosts"
    lines = [
        line("10.0.0.1", k1),
        line(_hashed("[10.0.0.1]:2222"), k1),
        line(_hashed("10.0.0.1"), k2),          # hashed, as ssh-keygen -H writes it
        "# " + line("10.0.0.1", k3),            # a comment
        "  # " + line("10.0.0.1", k3),          # an indented comment
        "@revoked " + line("10.0.0.1", k3),     # a marker line: neither a pin nor removed
        "10.0.0.1 ssh-ed25519",                 # malformed: ignored, and kept
        line("10.0.0.2", k3),
    ]
    known.write_text("\n".join(lines) + "\n")
    pins = PinnedHosts(known)
    assert pins.lookup("10.0.0.1", 22) == [k1, k2]
    assert pins.lookup("10.0.0.1", 2222) == [k1]
    assert pins.lookup("10.0.0.3", 22) == []
    pins.pin("10.0.0.1", 22, k3, replace=True)  # drops exactly what lookup found, plain and hashed
    assert pins.lookup("10.0.0.1", 22) == [k3]
    assert known.read_text().splitlines() == [lines[1], *lines[3:], line("10.0.0.1", k3)]
    # as asyncssh (and ssh) read it
    assert asyncssh.read_known_hosts(str(known)).match("10.0.0.1", "", 2222)[0] == [k1]


def test_pin_replace_swaps_the_keys_of_one_node_only(tmp_path: Path) -> None:
    pins = PinnedHosts(tmp_path / "known_hosts")
    k1, k2, k3 = (asyncssh.generate_private_key("ssh-ed25519").convert_to_public() for _ in range(3))
    pins.path.write_text("# my notes\n")
    pins.pin("10.0.0.1", 2222, k1, comment="higgsfield:a")
    pins.pin("10.0.0.1", 2222, k2)  # two keys pinned (e.g. two key types)
    pins.pin("10.0.0.2", 2222, k3)
    pins.pin("10.0.0.1", 2222, k3, comment="higgsfield:a", replace=True)
    assert pins.lookup("10.0.0.1", 2222) == [k3] and pins.lookup("10.0.0.2", 2222) == [k3]
    assert pins.path.read_text().startswith("# my notes\n")
    text = pins.path.read_text()
    pins.pin("10.0.0.1", 2222, k3, replace=True)  # already the only pin: the file is left alone
    assert pins.path.read_text() == text


def test_a_comment_stays_one_field_and_a_bad_byte_spoils_only_its_line(tmp_path: Path) -> None:
    pins = PinnedHosts(tmp_path / "known_hosts")
    k1, k2 = (asyncssh.generate_private_key("ssh-ed25519").convert_to_public() for _ in range(2))
    pins.path.write_bytes(b"\xff\xfe garbage line\n")
    pins.pin("10.0.0.1", 22, k1, comment="higgsfield:gpu 1\n10.0.0.9 ssh-ed25519 AAAA")
    pins.pin("10.0.0.2", 22, k2)
    lines = pins.path.read_bytes().splitlines()
    assert len(lines) == 3 and lines[0] == b"\xff\xfe garbage line"
    assert lines[1].endswith(b" higgsfield:gpu_1_10.0.0.9_ssh-ed25519_AAAA")
    assert pins.lookup("10.0.0.1", 22) == [k1] and pins.lookup("10.0.0.9", 22) == []
    assert pins.lookup("10.0.0.2", 22) == [k2]
    pins.pin("10.0.0.2", 22, k1, replace=True)  # a rewrite keeps the other lines byte for byte
    assert pins.path.read_bytes().splitlines()[:2] == lines[:2] and pins.lookup("10.0.0.2", 22) == [k1]

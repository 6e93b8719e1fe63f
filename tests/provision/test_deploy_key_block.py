"""The managed ~/.ssh/config block: inserted once, replaced in place, the rest untouched."""

from __future__ import annotations

import asyncssh

from higgsfield.control.provision.deploy_key import BEGIN, END, GITHUB_KNOWN_HOSTS, managed_block, with_block

USER_CONFIG = "Host *\n    ServerAliveInterval 60\n\nHost box\n    HostName 10.1.2.3\n"


def test_block_goes_first_and_is_idempotent() -> None:
    block = managed_block("proj")
    once = with_block(USER_CONFIG, block)
    assert once.startswith(BEGIN) and once.endswith(USER_CONFIG)
    assert with_block(once, block) == once
    assert once.count(BEGIN) == 1 and once.count(END) == 1
    assert with_block("", block) == block


def test_block_is_replaced_in_place() -> None:
    old = f"Host a\n    User x\n{BEGIN}\nHost github.com\n    IdentityFile ~/old\n{END}\nHost b\n    User y\n"
    new = with_block(old, managed_block("proj"))
    assert new.startswith("Host a\n    User x\n" + BEGIN)
    assert new.endswith(f"{END}\nHost b\n    User y\n")
    assert "~/old" not in new and "IdentitiesOnly yes" in new and "StrictHostKeyChecking yes" in new


def test_github_host_keys_match_published_fingerprints() -> None:
    published = {"SHA256:+DiY3wvvV6TuJJhbpZisF/zLDA0zPMSvHdkr4UvCOqU", "SHA256:p2QAMXNIC1TJYWeIOttrVc98/R1BUFWu3/LiyKgUfQM"}
    keys = [asyncssh.import_public_key(" ".join(ln.split()[1:3])) for ln in GITHUB_KNOWN_HOSTS.splitlines()]
    assert {k.get_fingerprint("sha256") for k in keys} == published

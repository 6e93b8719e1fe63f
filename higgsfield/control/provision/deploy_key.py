"""The deploy-key step: the project's GitHub deploy key on the node, and one managed ``~/.ssh/config`` block.

- The private key goes over SFTP to ``.ssh/higgsfield_deploy_key`` with mode 0600.
- GitHub's published host keys go to ``.ssh/higgsfield_github_known_hosts`` and the
  block checks them strictly, so the node's git never trusts an unknown github.com.
- The block is marked; a re-run replaces it in place (never appends a second one)
  and leaves the rest of the file byte for byte as it was.

The key pair is made by ``higgsfield init`` outside the project, at
``$XDG_CONFIG_HOME/higgsfield/keys/<project>/deploy_key`` (see :mod:`higgsfield.control.project.scaffold`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from higgsfield.control.provision.context import NodeContext
from higgsfield.control.provision.step import Check, Step
from higgsfield.control.remote.base import CommandResult
from higgsfield.control.remote.probe import Read

KEY_PATH = ".ssh/higgsfield_deploy_key"
KNOWN_HOSTS_PATH = ".ssh/higgsfield_github_known_hosts"
CONFIG_PATH = ".ssh/config"
BEGIN = "# >>> higgsfield (managed) >>>"
END = "# <<< higgsfield <<<"
# https://docs.github.com/en/authentication/keeping-your-account-and-data-secure/githubs-ssh-key-fingerprints
GITHUB_KNOWN_HOSTS = (
    "github.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"
    "github.com ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBEmKSENjQEezOmxkZMy7opKgwFB9"
    "nkt5YRrYMjNuG5N87uRgg6CLrbo5wAdT/y6v0mKV0U2w0WZ2YB/++Tpockg=\n"
)


KEY_HASH = ("sha256sum", KEY_PATH)
KEY_MODE = ("stat", "-c", "%a", KEY_PATH)
CONFIG_CAT = ("cat", CONFIG_PATH)
CONFIG_EXISTS = ("test", "-e", CONFIG_PATH)


def _config_text(cat: CommandResult, exists: CommandResult) -> str:
    """``~/.ssh/config`` as read by ``cat``: empty when absent; CommandError when it exists but is unreadable."""
    if not cat.ok and exists.ok:
        cat.check()
    return cat.stdout if cat.ok else ""


def default_key_path(project: str) -> Path:
    """Where ``higgsfield init`` keeps the project's deploy key (outside the project)."""
    from higgsfield.control.project.scaffold import deploy_key_paths

    return deploy_key_paths(project)[0]


def managed_block(project: str) -> str:
    return (f"{BEGIN}\n"
            f"# Written by 'higgsfield setup' (project {project}); edits inside this block are replaced.\n"
            "Host github.com\n"
            "    HostName github.com\n"
            "    User git\n"
            f"    IdentityFile ~/{KEY_PATH}\n"
            "    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile ~/{KNOWN_HOSTS_PATH}\n"
            "    StrictHostKeyChecking yes\n"
            f"{END}\n")


def with_block(config: str, block: str) -> str:
    """``config`` with the managed block replaced in place, or put first (ssh uses the first match)."""
    lines = config.splitlines(keepends=True)
    starts = [i for i, ln in enumerate(lines) if ln.rstrip("\r\n") == BEGIN]
    if starts:
        start = starts[0]
        end = next((i for i in range(start, len(lines)) if lines[i].rstrip("\r\n") == END), None)
        if end is not None:
            return "".join(lines[:start]) + block + "".join(lines[end + 1:])
    if not config:
        return block
    return block + "\n" + config


class DeployKeyStep(Step):
    name = "deploy-key"
    title = "deploy key"
    needs = ("os",)

    def _key(self, ctx: NodeContext) -> Path:
        return ctx.options.deploy_key or default_key_path(ctx.cfg.name)

    def _skip(self, ctx: NodeContext) -> Check | None:
        if ctx.node.is_local:
            return Check(False, "local node: uses your own git credentials", skip=True)
        key = self._key(ctx)
        if not key.is_file():
            return Check(False, f"no deploy key at {key}: run 'higgsfield init' or set a key path", skip=True)
        return None

    def reads(self, ctx: NodeContext) -> list[Read]:
        if self._skip(ctx):
            return []
        return [Read(KEY_HASH), Read(KEY_MODE), Read(("cat", KNOWN_HOSTS_PATH)), Read(CONFIG_CAT), Read(CONFIG_EXISTS)]

    async def check(self, ctx: NodeContext) -> Check:
        skip = self._skip(ctx)
        if skip:
            return skip
        want = hashlib.sha256(self._key(ctx).read_bytes()).hexdigest()
        problems = []
        r = await ctx.read(KEY_HASH)
        if not r.ok or r.stdout.split()[:1] != [want]:
            problems.append("key missing or different")
        mode = await ctx.read(KEY_MODE)
        if mode.ok and mode.stdout.strip() != "600":
            problems.append(f"key mode {mode.stdout.strip()}")
        kh = await ctx.read(("cat", KNOWN_HOSTS_PATH))
        if kh.stdout != GITHUB_KNOWN_HOSTS:
            problems.append("github.com host keys missing")
        config = _config_text(await ctx.read(CONFIG_CAT), await ctx.read(CONFIG_EXISTS))
        if with_block(config, managed_block(ctx.cfg.name)) != config:
            problems.append("~/.ssh/config block missing or different")
        if problems:
            return Check(False, "; ".join(problems))
        return Check(True, f"{KEY_PATH} (0600) + github.com block in ~/{CONFIG_PATH}")

    async def apply(self, ctx: NodeContext) -> str:
        await ctx.run(["mkdir", "-p", "-m", "700", ".ssh"])
        await ctx.run(["chmod", "700", ".ssh"])
        await ctx.transport.put_bytes(self._key(ctx).read_bytes(), KEY_PATH, mode=0o600)
        await ctx.transport.put_bytes(GITHUB_KNOWN_HOSTS.encode(), KNOWN_HOSTS_PATH, mode=0o644)
        config = _config_text(await ctx.run(CONFIG_CAT, check=False), await ctx.run(CONFIG_EXISTS, check=False))
        new = with_block(config, managed_block(ctx.cfg.name))
        if new != config:
            await ctx.transport.put_bytes(new.encode(), CONFIG_PATH, mode=0o600)
        return f"sent the deploy key (0600) and wrote the github.com block in ~/{CONFIG_PATH}"

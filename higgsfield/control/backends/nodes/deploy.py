"""``higgsfield deploy``: ship the project's code to every node at once, verify it, build the image there.

1. The code: ``git archive HEAD`` (the committed tree), or with ``dirty=True`` a tar of
   every tracked and untracked-but-not-ignored file as it is on disk (labelled
   ``<HEAD>-dirty-<hash>``, so two different dirty trees never look alike).
2. Every node, concurrently: ask what is deployed; send the tar over the invoker's
   stdin only when the commit differs (a re-deploy of the same commit ships nothing);
   the node unpacks it into a new release and swaps its ``code`` link atomically, then
   reports the commit it finds on disk, which must be ours.
3. Every node builds the image from the deployed Dockerfile with a tag hashed from the
   Dockerfile, requirements.txt and the base image; a tag that exists is not rebuilt.
   (``runtime: process`` skips the build; ``auto`` skips it where Docker is absent.)
4. Where runs will be plain processes (``runtime: process``, or ``auto`` on a node
   without an image), every node builds the project environment instead: a venv keyed
   by a hash of requirements.txt, with torch added when it is not listed
   (:mod:`higgsfield.node.code.environment`). An unchanged one is kept. Its progress
   streams back as lines prefixed by the node's name.
5. With ``retention:`` in higgsfield.yml, each node that deployed is then pruned as it says
   (:mod:`higgsfield.control.backends.nodes.prune`); a prune that fails is a warning line, never a failed deploy.

A ``localhost`` node runs from the working tree itself: nothing is shipped, only the
image is built (from the project directory).

Use::

    result = deploy(cfg)                       # raises GroupError naming failed nodes
    for n in result.nodes: print(n.node, n.shipped, n.image, n.built)
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import shutil
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

from higgsfield.contract.errors import DeployError
from higgsfield.contract.replies import BuildReply, Deployment, EnvLine, EnvReply
from higgsfield.control.backends.backend import DeployResult, NodeDeploy
from higgsfield.control.backends.nodes.output import decode_reply, invoke_reply, invoke_reply_or_none
from higgsfield.control.backends.nodes.prune import apply_retention
from higgsfield.control.config import Config
from higgsfield.control.remote import Group, Member, Transport, open_group
from higgsfield.control.remote.invoker import invoker_argv

GIT_TIMEOUT_S = 300.0
ENV_TIMEOUT_S = 3600.0


def _git(project_dir: Path, *args: str) -> bytes:
    git = shutil.which("git")
    if git is None:
        raise DeployError("git is not installed: deploy ships the project's git tree")
    try:
        p = subprocess.run([git, *args], cwd=project_dir, capture_output=True, check=False,  # noqa: S603
                           timeout=GIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise DeployError(f"git {args[0]} in {project_dir} took over {GIT_TIMEOUT_S:.0f}s") from None
    if p.returncode != 0:
        err = p.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        raise DeployError(f"git {args[0]} failed in {project_dir}: {err[0]}")
    return p.stdout


def make_archive(project_dir: Path, *, dirty: bool = False) -> tuple[bytes, str]:
    """(tar bytes, commit label) of the project: HEAD, or the working tree with ``dirty``."""
    try:
        head = _git(project_dir, "rev-parse", "--verify", "HEAD").decode().strip()
    except DeployError:
        raise DeployError(f"{project_dir} has no commit to deploy: commit your code first "
                          "(or deploy uncommitted changes with --dirty once there is a first commit)") from None
    if not dirty:
        return _git(project_dir, "archive", "--format=tar", "HEAD"), head
    names = [n for n in _git(project_dir, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
             .decode().split("\0") if n]
    buf = io.BytesIO()
    digest = hashlib.sha256()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(set(names)):
            path = project_dir / name
            if not path.exists() and not path.is_symlink():
                continue  # deleted in the working tree
            info = tar.gettarinfo(str(path), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            digest.update(name.encode() + b"\0")
            if info.isfile():
                data = path.read_bytes()
                digest.update(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                digest.update(info.linkname.encode())
                tar.addfile(info)
    return buf.getvalue(), f"{head}-dirty-{digest.hexdigest()[:8]}"


async def deploy_async(cfg: Config, *, dirty: bool = False, console: Any = None) -> DeployResult:
    t0 = time.monotonic()
    archive, commit = make_archive(cfg.project_dir, dirty=dirty)
    result = DeployResult(commit=commit, dirty=dirty, archive_bytes=len(archive))

    def say(msg: str) -> None:
        if console is not None:
            console.print(msg)

    say(f"deploying {commit[:12]}{' (with uncommitted changes)' if dirty else ''} "
        f"({len(archive) / 1024:.0f} KiB) to {len(cfg.nodes)} node(s)")

    async def one(m: Member) -> NodeDeploy:
        started = time.monotonic()
        node, t = m.node, m.transport
        nd = NodeDeploy(node=t.node)
        build_args = ["build", "--project", cfg.name, "--dockerfile", cfg.docker.dockerfile,
                      "--runtime", cfg.runtime]
        if cfg.docker.base_image:
            build_args += ["--base-image", cfg.docker.base_image]
        if node.is_local:
            nd.commit = commit
            build_args += ["--code-dir", str(cfg.project_dir)]
        else:
            have = await invoke_reply_or_none(t, cfg, ["deployed", "--project", cfg.name], Deployment, timeout=60)
            if have is None or have.commit != commit:
                have = await invoke_reply(t, cfg, ["deploy", "--project", cfg.name, "--commit", commit]
                                          + (["--dirty"] if dirty else []), Deployment, input=archive)
                nd.shipped = True
            if have.commit != commit:
                raise DeployError(f"{t.node}: deployed commit is {have.commit}, expected {commit}")
            nd.commit = have.commit
        b0 = time.monotonic()
        built = await invoke_reply(t, cfg, build_args, BuildReply, timeout=max(cfg.ssh.command_timeout, 3600))
        nd.build_seconds = time.monotonic() - b0
        nd.image, nd.built, nd.skipped_build = built.tag, bool(built.built), built.skipped
        if nd.image is None and cfg.runtime in ("process", "auto"):
            e0 = time.monotonic()
            env = await _build_env(t, cfg, node.is_local, say)
            nd.env_seconds = time.monotonic() - e0
            nd.env, nd.env_built, nd.env_python = env.key, bool(env.built), env.python
        nd.seconds = time.monotonic() - started
        what = "shipped" if nd.shipped else ("local tree" if node.is_local else "up to date")
        img = (f"image {nd.image} {'built' if nd.built else 'unchanged'}" if nd.image
               else f"no image ({nd.skipped_build})")
        if nd.env:
            img = f"environment {nd.env} {'built' if nd.env_built else 'unchanged'}"
        say(f"  {t.node}: {what}, {img} ({nd.seconds:.1f}s)")
        nd.retention = await apply_retention(t, cfg)   # retention: set: old runs and images go; a failure warns
        if nd.retention is not None:
            say(f"  {t.node}: {nd.retention}")
        return nd

    async with open_group(cfg) as group:
        results = await group.run(one)
    result.seconds = time.monotonic() - t0
    result.nodes = [r.value for r in results if r.ok and r.value is not None]
    Group.check(results, "deploy")
    if cfg.data:   # the data: entries that changed (an unchanged one sends nothing)
        from higgsfield.control.backends.nodes.data.push import push_async
        from higgsfield.control.secrets import collect

        pushed = await push_async(cfg, secrets=collect(cfg, required=False))
        say(f"data: {', '.join(f'{e.name} {e.version}' for e in pushed.entries)} on every node "
            f"({pushed.uplink_bytes} bytes sent from here)")
    return result


async def _build_env(t: Transport, cfg: Config, local: bool, say: Any) -> EnvReply:
    """``invoker env`` on one node: its progress lines are shown as they come, its result returned."""
    args = ["env", "--project", cfg.name] + (["--code-dir", str(cfg.project_dir)] if local else [])
    argv = [*invoker_argv(cfg, cfg.node(t.node)), *args]
    result: EnvReply | None = None

    async def consume() -> None:
        nonlocal result
        async for line in t.stream(argv):
            msg = decode_reply(t.node, line, EnvLine)
            if msg.progress is not None:
                say(f"  {t.node}: environment: {msg.progress}")
            elif msg.result is not None:
                result = msg.result

    limit = max(cfg.ssh.command_timeout, ENV_TIMEOUT_S)
    try:
        await asyncio.wait_for(consume(), limit)
    except asyncio.TimeoutError:
        raise DeployError(f"{t.node}: building the project environment took over {limit:.0f}s") from None
    if result is None:
        raise DeployError(f"{t.node}: the invoker built no project environment (no result line)")
    return result


def deploy(cfg: Config, *, dirty: bool = False, console: Any = None) -> DeployResult:
    """Ship, verify and build on every node (see the module doc); raises GroupError naming failed nodes."""
    return asyncio.run(deploy_async(cfg, dirty=dirty, console=console))

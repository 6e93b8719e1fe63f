"""The invoker step: this package, at exactly the control side's build, in its own venv on the node.

Everything travels over SFTP (``<state_dir>/wheels/``): the higgsfield wheel and, by
default, a wheelhouse of its dependencies for the node's Python and platform, so the
node needs no package index. ``pip install --no-index`` then installs from it. When
the control side cannot download the wheelhouse, the node's pip uses its own index.
The installed build id is recorded in ``<venv>/higgsfield-build`` and checked on re-runs.

The wheels are deleted once installed: nothing else needs them. Runs get this very
installed package (containers mount it, the ``runtime: process`` venv points at it),
so the nodes' exact build reaches every run with no package index and no copy.
"""

from __future__ import annotations

import re

import higgsfield
from higgsfield.contract.codec import decode
from higgsfield.contract.decode import DecodeError, loads
from higgsfield.contract.errors import StepFailed
from higgsfield.contract.layout import WHEELS
from higgsfield.control.provision.context import NodeContext
from higgsfield.control.provision.step import Check, Step
from higgsfield.control.provision.wheels import NodePython, build_id
from higgsfield.control.remote.invoker import invoker_bin, venv_dir
from higgsfield.control.remote.probe import Read

MIN_PYTHON = (3, 10)
_PROBE = ("import json, platform, sys; print(json.dumps({'version': '%d.%d' % sys.version_info[:2], "
          "'machine': platform.machine(), 'glibc': platform.libc_ver()[1] or None}))")
VERSION_RE = re.compile(r"version\s+(\S+)")


def _version_argv(ctx: NodeContext) -> tuple[str, ...]:
    return (*invoker_bin(ctx.cfg, ctx.node), "--version")


async def installed_version(ctx: NodeContext) -> str | None:
    """The invoker's version on the node (``higgsfield --version``), or None when absent."""
    r = await ctx.read(_version_argv(ctx))
    m = VERSION_RE.search(r.stdout) if r.ok else None
    return m.group(1) if m else None


def _node_python(stdout: str) -> NodePython:
    """``_PROBE``'s answer, decoded once (typed fields); one that does not decode fails the step in one line."""
    try:
        py = decode(NodePython, loads(stdout))
    except DecodeError as e:
        raise StepFailed(f"the node's python3 did not describe itself: {e}") from None
    return py


class InvokerStep(Step):
    name = "invoker"
    title = "invoker"
    needs = ("os",)

    def _marker(self, ctx: NodeContext) -> str:
        return f"{venv_dir(ctx.cfg)}/higgsfield-build"

    def reads(self, ctx: NodeContext) -> list[Read]:
        return [] if ctx.node.is_local else [Read(_version_argv(ctx)), Read(("cat", self._marker(ctx)))]

    async def check(self, ctx: NodeContext) -> Check:
        if ctx.node.is_local:
            return Check(False, f"local node: runs this Python's higgsfield {higgsfield.__version__}", skip=True)
        version = await installed_version(ctx)
        if version is None:
            return Check(False, "not installed")
        if version != higgsfield.__version__:
            return Check(False, f"version {version} installed, {higgsfield.__version__} wanted")
        marker = await ctx.read(("cat", self._marker(ctx)))
        if marker.stdout.strip() != build_id():
            return Check(False, f"{version} installed from another build ({marker.stdout.strip() or 'unknown'})")
        return Check(True, f"higgsfield {version}")

    async def _python(self, ctx: NodeContext) -> NodePython:
        r = await ctx.run(["python3", "-c", _PROBE], check=False)
        if r.exit_status == 127:
            await ctx.apt_install("python3", "python3-venv")
            r = await ctx.run(["python3", "-c", _PROBE])
        r.check()
        py = _node_python(r.stdout)
        if tuple(int(x) for x in py.version.split(".")) < MIN_PYTHON:
            raise StepFailed(f"the node's python3 is {py.version}; the invoker needs Python >= "
                             f"{'.'.join(map(str, MIN_PYTHON))}")
        if not await ctx.ok(["python3", "-c", "import venv, ensurepip"]):
            await ctx.apt_install(f"python{py.version}-venv")
        return py

    async def apply(self, ctx: NodeContext) -> str:
        py = await self._python(ctx)
        wheel = await ctx.artifacts.wheel()
        house = await ctx.artifacts.wheelhouse(py) if ctx.options.wheelhouse else None
        remote = f"{ctx.state_dir}/{WHEELS}"
        await ctx.run(["rm", "-rf", remote])
        await ctx.run(["mkdir", "-p", remote])
        await ctx.transport.put_file(str(wheel), f"{remote}/{wheel.name}", mode=0o644)
        sent = 1
        for f in sorted(house.glob("*.whl")) if house else []:
            await ctx.transport.put_file(str(f), f"{remote}/{f.name}", mode=0o644)
            sent += 1
        venv = venv_dir(ctx.cfg)
        fresh = not await ctx.ok([f"{venv}/bin/python", "-c", "import sys"])
        pip_wheel = next(iter(sorted(house.glob("pip-*.whl"))), None) if house else None
        if fresh:
            await ctx.run(["rm", "-rf", venv])
            # ensurepip is slow; with pip's own wheel at hand, run pip from it instead
            await ctx.run(["python3", "-m", "venv", *(["--without-pip"] if pip_wheel else []), venv], timeout=600)
        pip = [f"{venv}/bin/python", f"{remote}/{pip_wheel.name}/pip"] if pip_wheel and fresh else \
              [f"{venv}/bin/python", "-m", "pip"]
        pip += ["install", "-q", "--disable-pip-version-check", "--no-compile"]
        source = ["--no-index", "--find-links", remote] if house else []
        await ctx.run([*pip, *source, f"{remote}/{wheel.name}", *(["pip"] if pip_wheel else [])], timeout=1800)
        if not fresh:  # the same version may be installed from another build: replace the package itself
            await ctx.run([*pip, "--no-deps", "--force-reinstall", f"{remote}/{wheel.name}"], timeout=600)
        await ctx.transport.put_bytes(f"{build_id()}\n".encode(), self._marker(ctx), mode=0o644)
        await ctx.run(["rm", "-rf", remote])
        how = f"{sent} wheels over SFTP, no index" if house else "wheel over SFTP, dependencies from the node's index"
        return f"installed higgsfield {higgsfield.__version__} ({how})"

    async def verify(self, ctx: NodeContext) -> str:
        version = await installed_version(ctx)
        if version != higgsfield.__version__:
            raise StepFailed(f"the node's invoker reports {version or 'nothing'}, expected {higgsfield.__version__}")
        return await super().verify(ctx)

"""System steps: the OS and sudo, Docker, the docker group, the NVIDIA toolkit, the base image."""

from __future__ import annotations

import shlex

from higgsfield.contract.errors import StepFailed
from higgsfield.contract.layout import TMP
from higgsfield.control.provision.context import NodeContext
from higgsfield.control.provision.step import Check, Step
from higgsfield.control.remote.docker_info import DOCKER_INFO, docker_info
from higgsfield.control.remote.probe import Read

DOCKER_PACKAGES = ("docker.io",)  # the distribution's package: no third-party script, no curl | bash
NVIDIA_REPO = "https://nvidia.github.io/libnvidia-container"
NVIDIA_KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
NVIDIA_LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"

UNAME = ("uname", "-sm")
OS_RELEASE = ("cat", "/etc/os-release")
SUDO_OK = ("sudo", "-n", "true")
DOCKER_CLI = ("docker", "--version")
USER_GROUPS = ("sh", "-c", 'id -nG "$(id -un)"')  # the group database's, not this login's (which may predate)
GPU_NAMES = ("nvidia-smi", "--query-gpu=name", "--format=csv,noheader")


class OsStep(Step):
    name = "os"
    title = "OS + sudo"

    def reads(self, ctx: NodeContext) -> list[Read]:
        return [Read(UNAME), Read(OS_RELEASE), Read(SUDO_OK)]

    async def check(self, ctx: NodeContext) -> Check:
        kernel = (await ctx.read(UNAME)).check().stdout.split()
        if not kernel or kernel[0] != "Linux":
            raise StepFailed(f"{ctx.name} runs {' '.join(kernel) or 'an unknown OS'}: only Linux nodes are supported")
        release = (await ctx.read(OS_RELEASE)).stdout
        fields = dict(ln.split("=", 1) for ln in release.splitlines() if "=" in ln)
        pretty = fields.get("PRETTY_NAME", "Linux").strip('"')
        ctx.facts.arch = kernel[1] if len(kernel) > 1 else ""
        if await ctx.uid() == 0:
            return Check(True, f"{pretty}, {ctx.facts.arch}, root")
        sudo = await ctx.read(SUDO_OK)
        if not sudo.ok:
            user = await ctx.user()
            why = (sudo.stderr.strip().splitlines() or ["sudo failed"])[-1]
            if sudo.exit_status == 127:
                why = "sudo is not installed"
            raise StepFailed(
                f"passwordless sudo is required for {user} ({why}); on the node run: "
                f"echo '{user} ALL=(ALL) NOPASSWD:ALL' | sudo tee /etc/sudoers.d/{user}")
        return Check(True, f"{pretty}, {ctx.facts.arch}, passwordless sudo")

    async def apply(self, ctx: NodeContext) -> str:
        raise StepFailed("nothing to apply")  # check either passes or raises


class DockerStep(Step):
    name = "docker"
    title = "Docker"
    needs = ("os",)

    def reads(self, ctx: NodeContext) -> list[Read]:
        return [Read(DOCKER_CLI), Read(DOCKER_INFO, root=True, user_first=True)]

    async def check(self, ctx: NodeContext) -> Check:
        if not (await ctx.read(DOCKER_CLI)).ok:
            return Check(False, "docker is not installed")
        version = docker_info(await ctx.read(DOCKER_INFO, root=True, user_first=True)).ServerVersion
        if not version:
            return Check(False, "docker is installed but its engine does not answer")
        return Check(True, f"Docker {version}")

    async def apply(self, ctx: NodeContext) -> str:
        did = []
        if not await ctx.ok(["docker", "--version"]):
            await ctx.apt_install(*DOCKER_PACKAGES)
            did.append(f"installed {' '.join(DOCKER_PACKAGES)} from the distribution")
        if await ctx.ok(["sh", "-c", "command -v systemctl && test -d /run/systemd/system"]):
            await ctx.sudo(["systemctl", "enable", "--now", "docker"])
            did.append("started the docker service")
        return "; ".join(did) or "docker engine started"

    async def verify(self, ctx: NodeContext) -> str:
        result = await self.check(ctx)
        if not result.done:
            raise StepFailed(f"{result.detail}; start it (e.g. sudo systemctl start docker) and re-run")
        return result.detail


class DockerGroupStep(Step):
    name = "docker-group"
    title = "docker group"
    needs = ("docker",)

    def reads(self, ctx: NodeContext) -> list[Read]:
        return [Read(DOCKER_INFO), Read(USER_GROUPS)]

    async def check(self, ctx: NodeContext) -> Check:
        user = await ctx.user()
        if await ctx.uid() == 0:
            return Check(True, "root uses docker directly")
        if (await ctx.read(DOCKER_INFO)).ok:
            return Check(True, f"{user} can use docker")
        groups = (await ctx.read(USER_GROUPS)).check().stdout.split()
        if "docker" in groups:
            return Check(False, f"{user} is in the docker group but this login predates it")
        return Check(False, f"{user} is not in the docker group")

    async def apply(self, ctx: NodeContext) -> str:
        user = await ctx.user()
        groups = (await ctx.run(["id", "-nG", user])).stdout.split()
        did = "already in the docker group"
        if "docker" not in groups:
            await ctx.sudo(["usermod", "-aG", "docker", user])
            did = f"added {user} to the docker group"
        reconnect = getattr(ctx.transport, "reconnect", None)
        if reconnect is None:
            raise StepFailed(f"{did}; log out and in again (or run 'newgrp docker') so it takes effect")
        await reconnect()  # a new login session picks up the new group
        return f"{did}; reconnected"


class NvidiaStep(Step):
    name = "nvidia"
    title = "NVIDIA toolkit"
    needs = ("docker",)

    def reads(self, ctx: NodeContext) -> list[Read]:
        return [Read(GPU_NAMES), Read(DOCKER_INFO, root=True, user_first=True)]

    async def _gpus(self, ctx: NodeContext) -> list[str]:
        r = await ctx.read(GPU_NAMES)
        return [ln.strip() for ln in r.stdout.splitlines() if ln.strip()] if r.ok else []

    async def _runtime(self, ctx: NodeContext) -> bool:
        return docker_info(await ctx.read(DOCKER_INFO, root=True, user_first=True)).nvidia

    async def check(self, ctx: NodeContext) -> Check:
        gpus = await self._gpus(ctx)
        if not gpus:
            return Check(False, "no NVIDIA GPU found (nvidia-smi absent or lists none)", skip=True)
        what = f"{len(gpus)} x {gpus[0]}"
        if await self._runtime(ctx):
            return Check(True, f"{what}; docker has the nvidia runtime")
        return Check(False, f"{what}; docker lacks the nvidia runtime")

    async def apply(self, ctx: NodeContext) -> str:
        # NVIDIA's apt repository over HTTPS, its key in a dedicated keyring referenced by signed-by:
        # apt verifies every package; nothing downloaded is executed.
        arch = (await ctx.run(["dpkg", "--print-architecture"])).stdout.strip()
        tmp = f"{ctx.state_dir}/{TMP}"
        await ctx.run(["mkdir", "-p", tmp])
        await ctx.run(["curl", "-fsSL", "--proto", "=https", "-o", f"{tmp}/nvidia.gpgkey", f"{NVIDIA_REPO}/gpgkey"],
                      timeout=300)
        await ctx.sudo(["gpg", "--batch", "--yes", "--dearmor", "-o", NVIDIA_KEYRING, f"{tmp}/nvidia.gpgkey"])
        line = f"deb [signed-by={NVIDIA_KEYRING}] {NVIDIA_REPO}/stable/deb/{arch} /\n"
        await ctx.transport.put_bytes(line.encode(), f"{tmp}/nvidia.list", mode=0o644)
        await ctx.sudo(["install", "-m", "644", f"{tmp}/nvidia.list", NVIDIA_LIST])
        ctx.facts.apt_updated = False
        await ctx.apt_install("nvidia-container-toolkit")
        await ctx.sudo(["nvidia-ctk", "runtime", "configure", "--runtime=docker"])
        if await ctx.ok(["sh", "-c", "command -v systemctl && test -d /run/systemd/system"]):
            await ctx.sudo(["systemctl", "restart", "docker"])
        else:
            raise StepFailed("installed nvidia-container-toolkit; restart the docker engine so it loads the runtime")
        return "installed nvidia-container-toolkit and configured docker"


class BaseImageStep(Step):
    name = "base-image"
    title = "base image"
    needs = ("docker-group",)

    def _inspect(self, ctx: NodeContext) -> tuple[str, ...] | None:
        image = ctx.cfg.docker.base_image
        return ("docker", "image", "inspect", "--format", "{{.Id}}", image) if image else None

    def reads(self, ctx: NodeContext) -> list[Read]:
        inspect = self._inspect(ctx)
        return [Read(inspect)] if inspect else []

    async def check(self, ctx: NodeContext) -> Check:
        image = ctx.cfg.docker.base_image
        inspect = self._inspect(ctx)
        if not image or not inspect:
            return Check(False, "docker.base_image is not set in higgsfield.yml", skip=True)
        r = await ctx.read(inspect)
        if r.ok:
            return Check(True, f"{image} present ({r.stdout.strip()[:19]})")
        if "permission denied" in r.stderr.lower():
            raise StepFailed(f"the user cannot use docker yet: run the docker-group step "
                             f"(higgsfield setup --step docker-group); {r.stderr.strip()}")
        return Check(False, f"{image} is not on the node")

    async def apply(self, ctx: NodeContext) -> str:
        image = ctx.cfg.docker.base_image
        assert image
        r = await ctx.run(["docker", "pull", image], check=False, timeout=3600)
        if not r.ok:
            tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
            raise StepFailed(f"docker pull {shlex.quote(image)} failed: {tail}")
        return f"pulled {image}"

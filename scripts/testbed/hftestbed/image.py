"""The offline base image: Debian by debootstrap, then a torch layer built from local wheels.

``higgsfield-testbase:bookworm`` is debootstrap minbase imported into the engine;
``higgsfield-testbase:torch2.13`` adds a venv (``/opt/venv``) with torch and
higgsfield's dependencies. Both are skipped when the engine already has them.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from .base import TestbedError, exe
from .dockerd import docker_env
from .procs import run, run_timestamped
from .timings import Timings
from .wheels import TORCH_VERSION, download_wheels, image_requirements, serve_directory

BOOTSTRAP_IMAGE = "higgsfield-testbase:bookworm"

BASE_IMAGE = "higgsfield-testbase:torch2.13"

SUITE = "bookworm"

DEBOOTSTRAP_INCLUDE = "python3,python3-venv,python3-pip,git,openssh-client,ca-certificates"

IMAGE_VENV = "/opt/venv"


def image_exists(name: str) -> bool:
    return subprocess.run([exe("docker"), "image", "inspect", name], capture_output=True,
                          env=docker_env()).returncode == 0


def debian_mirror() -> str:
    """The Debian mirror apt is configured with (for debootstrap)."""
    if os.environ.get("TESTBED_MIRROR"):
        return os.environ["TESTBED_MIRROR"]
    files = sorted(Path("/etc/apt/sources.list.d").glob("*.sources")) + \
        sorted(Path("/etc/apt/sources.list.d").glob("*.list")) + [Path("/etc/apt/sources.list")]
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line or line[:1].isspace():
                        continue
                    k, v = line.split(":", 1)
                    fields[k.strip().lower()] = v.strip()
                if ("deb" in fields.get("types", "").split()
                        and SUITE in fields.get("suites", "").split()
                        and fields.get("enabled", "yes").lower() != "no"):
                    uri = fields.get("uris", "").split()
                    if uri:
                        return uri[0]
        else:
            for line in text.splitlines():
                parts = re.sub(r"\[[^]]*\]", "", line).split()
                if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE:
                    return parts[1]
    return "http://deb.debian.org/debian"


def build_bootstrap_image(sdir: Path, timings: Timings) -> None:
    rootfs = sdir / "rootfs"
    if rootfs.exists():
        shutil.rmtree(rootfs)  # a partial debootstrap from an interrupted run
    mirror = debian_mirror()
    with timings.phase("debootstrap") as info:
        run(["debootstrap", "--variant=minbase", f"--include={DEBOOTSTRAP_INCLUDE}",
             SUITE, rootfs, mirror])
        # shrink: downloaded .debs and apt lists are not needed in the image
        for p in (rootfs / "var/cache/apt/archives").glob("*.deb"):
            p.unlink()
        shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
        (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
        info["note"] = f"mirror {mirror}"
    with timings.phase("docker import") as info:
        tar = subprocess.Popen([exe("tar"), "--numeric-owner", "-C", rootfs, "-c", "."],
                               stdout=subprocess.PIPE)
        changes = ["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                   "ENV LANG=C.UTF-8", 'CMD ["/bin/bash"]']
        argv = ["docker", "import"]
        for c in changes:
            argv += ["--change", c]
        imp = subprocess.run([*argv, "-", BOOTSTRAP_IMAGE], stdin=tar.stdout,
                             env=docker_env(), capture_output=True, text=True)
        assert tar.stdout is not None
        tar.stdout.close()
        tar_rc = tar.wait()
        if tar_rc != 0 or imp.returncode != 0:
            raise TestbedError(f"docker import failed (tar rc={tar_rc}): {imp.stderr}")
        info["note"] = BOOTSTRAP_IMAGE
    shutil.rmtree(rootfs, ignore_errors=True)


def dockerfile() -> str:
    """The torch layer: a venv with :func:`image_requirements`, installed from wheels served on 127.0.0.1."""
    return f"""\
FROM {BOOTSTRAP_IMAGE}
# metadata first: every step after the big layer would cost a container commit
ENV VIRTUAL_ENV={IMAGE_VENV} \\
    PATH={IMAGE_VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    LANG=C.UTF-8
LABEL org.higgsfield.testbed="1" org.higgsfield.torch="{TORCH_VERSION}"
CMD ["/bin/bash"]
ARG WHEELS_URL
# wheels come from the host over 127.0.0.1 (no registry, no copy of torch in a layer)
# pip compiles .pyc one file at a time; compileall -j0 uses every core
RUN /usr/bin/python3 -m venv {IMAGE_VENV} \\
 && {IMAGE_VENV}/bin/pip install --no-cache-dir --no-compile --no-index --find-links "$WHEELS_URL" \\
      {' '.join(map(shlex.quote, image_requirements()))} \\
 && ({IMAGE_VENV}/bin/python -m compileall -q -j 0 {IMAGE_VENV}/lib >/dev/null || true) \\
 && {IMAGE_VENV}/bin/python -c "import torch; assert torch.__version__.startswith('{TORCH_VERSION}')"
"""


def image_id(name: str) -> str | None:
    p = subprocess.run([exe("docker"), "image", "inspect", "--format", "{{.Id}}", name],
                       capture_output=True, text=True, env=docker_env())
    return p.stdout.strip() if p.returncode == 0 else None


def build_torch_image(sdir: Path, timings: Timings) -> None:
    wheel_dir = sdir / "wheels"
    old_id = image_id(BASE_IMAGE)
    with timings.phase("pip download") as info:
        info["note"] = download_wheels(wheel_dir)
    with timings.phase("torch layer") as info:
        with tempfile.TemporaryDirectory(prefix="build-", dir=sdir) as ctx:
            (Path(ctx) / "Dockerfile").write_text(dockerfile())
            with serve_directory(wheel_dir) as url:
                env = docker_env()
                env["DOCKER_BUILDKIT"] = "0"  # legacy builder: --network host, no buildx
                run_timestamped(["docker", "build", "--network", "host",
                                 "--build-arg", f"WHEELS_URL={url}", "--tag", BASE_IMAGE, ctx],
                                env=env)
        info["note"] = BASE_IMAGE
    if old_id and old_id != image_id(BASE_IMAGE):
        # the image this rebuild replaced is now untagged; drop it (fails if still in use)
        run(["docker", "image", "rm", old_id], check=False, capture=True, quiet=True)


def ensure_image(sdir: Path, timings: Timings, force: bool = False) -> str:
    """Build the base image unless cached; force rebuilds the torch layer only
    (`docker rmi higgsfield-testbase:bookworm` to redo debootstrap as well)."""
    if not force and image_exists(BASE_IMAGE):
        return f"{BASE_IMAGE} cached"
    if not image_exists(BOOTSTRAP_IMAGE):
        build_bootstrap_image(sdir, timings)
    build_torch_image(sdir, timings)
    return f"built {BASE_IMAGE}"

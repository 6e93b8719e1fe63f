"""The wheels of the base image's venv: downloaded on the host, served to ``docker build`` over 127.0.0.1.

The image gets torch (CPU) plus higgsfield's own dependencies, read from
pyproject.toml (``[project].dependencies``) so they are written once. The build
reaches no registry: pip in the build container installs from a ``--find-links``
URL that :func:`serve_directory` answers on the host's loopback.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from .base import REPO_ROOT, TestbedError
from .procs import run

TORCH_VERSION = "2.13.0"


def control_deps() -> list[str]:
    """higgsfield's runtime dependencies, as pyproject.toml lists them (tomllib: Python 3.11+)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise TestbedError("reading pyproject.toml needs Python 3.11+ (tomllib)") from None
    with open(REPO_ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def image_requirements() -> list[str]:
    """What pip installs into the image's venv."""
    # numpy: without it every `import torch` warns "Failed to initialize NumPy"
    return [f"torch=={TORCH_VERSION}", "numpy", *control_deps()]


def cuda_wheels(wheel_dir: Path) -> list[str]:
    """The wheels that only a CUDA build of torch pulls in (cuBLAS, cuDNN, the CUDA runtime, cuda-toolkit...).

    Not every ``nvidia_*`` wheel: higgsfield itself depends on ``nvidia-ml-py`` (NVML's bindings, pure Python).
    """
    return sorted(w.name for w in wheel_dir.glob("*.whl") if w.name.startswith(("nvidia_cu", "cuda_")))


def download_wheels(wheel_dir: Path) -> str:
    """torch (CPU) plus the control-side deps, as wheels for CPython 3.11 manylinux."""
    reqs = image_requirements()
    stamp = wheel_dir / ".complete"
    want = "\n".join(reqs)
    if stamp.exists() and stamp.read_text() == want and list(wheel_dir.glob("torch-*.whl")):
        return "cached"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    # the host's pip config (find-links /opt/wheels) supplies the CPU torch wheel
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", wheel_dir,
            "--only-binary=:all:"]
    if sys.version_info[:2] != (3, 11):
        argv += ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
                 "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
                 "--platform", "linux_x86_64"]
    # captured: the host's pip config makes it warn about every missing local index dir
    run([*argv, *reqs], capture=True)
    cuda = cuda_wheels(wheel_dir)
    if cuda:
        raise TestbedError(f"pip resolved a CUDA torch build into {wheel_dir} ({cuda[0]}, ...); "
                           f"the test bed needs the CPU wheel of torch {TORCH_VERSION}")
    if not list(wheel_dir.glob(f"torch-{TORCH_VERSION}*.whl")):
        raise TestbedError(f"no torch {TORCH_VERSION} wheel in {wheel_dir}")
    stamp.write_text(want)
    return f"{len(list(wheel_dir.glob('*.whl')))} wheels"


@contextlib.contextmanager
def serve_directory(directory: Path) -> Iterator[str]:
    """Serve a directory over HTTP on 127.0.0.1 (a pip --find-links for docker build)."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

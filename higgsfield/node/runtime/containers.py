"""The Docker runtime and image builds, through the docker SDK (node side).

A run's container runs the very command the process runtime runs::

    python -m torch.distributed.run --nnodes N --node_rank i ... -m higgsfield.node.entrypoint RUN_DIR

behind a small launcher (``python -m higgsfield.node.runtime.launch LOG -- ...``) that reads
the run's secrets as one JSON line on the container's stdin (written by the supervisor
over an attach), puts them in its environment and execs torchrun: secrets are in
no file and not in the container's configuration (``docker inspect``),

with host network and IPC (NCCL and gloo find their peers as on the host), the node
user's uid:gid (files it writes belong to the user), ``--init`` (signals reach
torchrun, zombies are reaped), GPUs through device requests when the node has any,
and these bind mounts, each at the same path as on the host so the run's spec and
records read the same inside and out:

- the deployed code (read-only),
- the run directory (spec, per-rank logs, pid and error files),
- the project's checkpoint/cache directory ``~/.cache/higgsfield/<project>``,
- a path mirror (``checkpoint.mirror: /nfs/ckpt``), checked writable when the run starts,
- this invoker's own ``higgsfield`` package at ``/opt/higgsfield-invoker`` (read-only,
  first on ``PYTHONPATH``).

That last mount is how the image gets the invoker's exact version of the launchers
(``higgsfield.node.runtime.launch``, ``higgsfield.node.entrypoint``) and the experiment API
without a rebuild whenever higgsfield is upgraded: the image only has to provide
Python, torch and the project's requirements (the scaffolded Dockerfile installs no
higgsfield at all, so a build never needs a package index for it: a checkout, a fork
or a pre-release on the nodes runs as it is).
A Docker engine that goes away mid-run (a daemon restart) ends the run ``failed`` with
that reason.

The supervisor (a host process, see :mod:`higgsfield.node.runs.supervisor`) creates the
container (:class:`ContainerRun`), waits on it, stops it when the run aborts and
records how it ended, so records, logs and kill work as in the process runtime. Containers carry labels (project, run, node, run dir), so a
kill or a status check finds them even when a record lacks the container's name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from higgsfield.contract import layout
from higgsfield.contract.codec import DecodeError, decode
from higgsfield.contract.errors import RunError
from higgsfield.node.state.placement import NodeRun
from higgsfield.node.state.records import RunDir

INVOKER_MOUNT = "/opt/higgsfield-invoker"
LABEL = "org.higgsfield"
_NAME_BAD = re.compile(r"[^a-zA-Z0-9_.-]+")


def _sdk() -> Any:
    try:
        import docker
    except ImportError:  # pragma: no cover - docker is a dependency of higgsfield
        raise RunError("the docker Python SDK is not installed in the invoker's environment") from None
    return docker


def client(timeout: float | None = 60) -> Any:
    """A docker client from the environment (DOCKER_HOST or the default socket)."""
    docker = _sdk()
    try:
        return docker.from_env(timeout=timeout)
    except docker.errors.DockerException as e:
        raise RunError(f"cannot reach the Docker engine: {e}") from None


def available(timeout: float = 5) -> bool:
    """True when a Docker engine answers to this user."""
    try:
        cl = client(timeout=timeout)
        cl.ping()
        cl.close()
        return True
    except Exception:  # noqa: BLE001 - any failure means "no docker here"
        return False


def container_name(project: str, experiment: str, run: str, node: str) -> str:
    """``hf-<project>-<experiment>-<run>-<node>``, sanitised for Docker (nodes may share an engine)."""
    raw = f"hf-{project}-{experiment}-{run}-{node}"
    name = _NAME_BAD.sub("_", raw).strip("_.-")
    if len(name) > 200:
        name = name[:187] + "-" + hashlib.sha256(raw.encode()).hexdigest()[:12]
    return name


def image_tag(project: str, code_dir: Path, dockerfile: str = "Dockerfile", base_image: str | None = None) -> str:
    """``hf-<project>:<sha256(Dockerfile + requirements.txt + base image)[:12]>``.

    The code is not part of the tag: runs mount the deployed code, so a code change
    never rebuilds the image; only a change of the Dockerfile, requirements.txt or the
    base image does.
    """
    h = hashlib.sha256()
    for name in (dockerfile, "requirements.txt"):
        p = code_dir / name
        h.update(name.encode() + b"\0")
        h.update(p.read_bytes() if p.is_file() else b"<none>")
        h.update(b"\0")
    h.update((base_image or "").encode())
    repo = re.sub(r"[^a-z0-9_.-]", "_", f"hf-{project}".lower())
    return f"{repo}:{h.hexdigest()[:12]}"


def image_exists(tag: str) -> bool:
    docker = _sdk()
    cl = client()
    try:
        cl.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False
    finally:
        cl.close()


@dataclass(frozen=True)
class BuildChunk:
    """One object of the Docker engine's build stream: a line of output (``stream``), a pull's ``status``, or
    the ``error`` that ended the build (its other keys are not read)."""

    WHAT: ClassVar[str] = "build output"

    stream: str = ""
    status: str = ""
    error: str = ""

    @property
    def text(self) -> str:
        """What goes into the build's log."""
        return f"ERROR: {self.error}\n" if self.error else self.stream or self.status


def _chunk(raw: object) -> BuildChunk:
    try:
        return decode(BuildChunk, raw)
    except DecodeError:
        return BuildChunk()   # a shape this engine's version adds: nothing to show


def build_image(code_dir: Path, tag: str, *, dockerfile: str = "Dockerfile", buildargs: dict[str, str] | None = None,
                log_path: Path | None = None, timeout: float | None = None) -> None:
    """``docker build`` of ``code_dir`` as ``tag``; the output goes to ``log_path``; raises RunError on failure."""
    if not (code_dir / dockerfile).is_file():
        raise RunError(f"no {dockerfile} in the deployed code ({code_dir})")
    cl = client(timeout=timeout)
    tail: list[str] = []
    log = open(log_path, "w") if log_path else None  # noqa: SIM115
    try:
        stream = cl.api.build(path=str(code_dir), dockerfile=dockerfile, tag=tag, buildargs=buildargs or {},
                              network_mode="host", rm=True, forcerm=True, pull=False, decode=True,
                              labels={f"{LABEL}.image": "1"})
        for chunk in map(_chunk, stream):
            text = chunk.text
            if chunk.error:
                tail.append(chunk.error.strip())
            if text:
                if log:
                    log.write(text)
                    log.flush()
                tail.extend(t for t in text.strip().splitlines() if t.strip())
                del tail[:-20]
            if chunk.error:
                raise RunError(f"docker build of {tag} failed: {chunk.error.strip()}"
                               + (f" (log: {log_path})" if log_path else ""))
    except _sdk().errors.APIError as e:
        raise RunError(f"docker build of {tag} failed: {e.explanation or e}") from None
    finally:
        if log:
            log.close()
        cl.close()
    if not image_exists(tag):
        raise RunError(f"docker build of {tag} produced no image: {' | '.join(tail[-3:])}")


def _invoker_package_dir() -> Path:
    import higgsfield

    return Path(higgsfield.__file__).resolve().parent


class ContainerRun:
    """The run's container on this node (the Docker runtime), created, started and watched.

    The container's command is the launcher (:mod:`higgsfield.node.runtime.launch`): once
    it runs, ``secrets`` are written to its stdin as one JSON line, so they never sit
    in a file or in the container's configuration. ``poll``/``wait`` give its exit
    code (a thread waits on the engine); ``terminate(grace)`` is ``docker stop``
    (SIGTERM to torchrun, SIGKILL after ``grace``) without blocking; ``cleanup``
    removes it. Raises RunError when the container cannot be created, and ``poll``
    raises it when the engine went away during the run. ``gpu_ids``: the GPUs the run
    holds on this node (device requests; none on a CPU node).
    """

    def __init__(self, run: NodeRun, rd: RunDir, argv: list[str], env: dict[str, str], *,
                 gpu_ids: Sequence[int] = (), secrets: dict[str, str] | None = None) -> None:
        docker = _sdk()
        self._engine_lost: tuple[type[BaseException], ...] = (docker.errors.DockerException, *_requests_errors())
        self.name = run.placement.container
        self.grace = run.placement.stop_grace
        self._rc: int | None = None
        self._error: str | None = None
        self._done = threading.Event()
        self.client = client(timeout=120)
        try:
            self.container = self._create(docker, run, rd, argv, env, list(gpu_ids))
            self.container.start()
            _send_secrets(self.client, self.container, secrets or {})
        except docker.errors.APIError as e:
            self.cleanup()
            raise RunError(f"cannot start container {self.name}: {e.explanation or e}") from None
        except RunError:
            self.cleanup()
            raise
        except self._engine_lost as e:
            self.cleanup()
            raise RunError(f"lost the Docker engine while starting container {self.name}: {e}") from None
        threading.Thread(target=self._wait, name="higgsfield-container-wait", daemon=True).start()

    def _create(self, docker: Any, run: NodeRun, rd: RunDir, argv: list[str], env: dict[str, str],
                slots: list[int]) -> Any:
        try:
            _remove_stale(self.client, self.name)
        except self._engine_lost as e:
            raise RunError(f"lost the Docker engine while removing a stale {self.name}: {e}") from None
        spec = run.spec
        code_dir = spec.code_dir
        volumes = mounts(run, rd)
        device_requests = [docker.types.DeviceRequest(device_ids=[str(i) for i in slots], capabilities=[["gpu"]])] \
            if slots else None
        command = [argv[0], "-m", "higgsfield.node.runtime.launch", str(rd.launcher_log), "--", *argv]
        labels = {f"{LABEL}.project": spec.project, f"{LABEL}.run": spec.run,
                  f"{LABEL}.node": spec.node, f"{LABEL}.run_dir": str(rd.path)}
        return self.client.containers.create(
            run.placement.image, command=command, name=self.name, detach=True, environment=env, stdin_open=True,
            network_mode="host", ipc_mode="host", user=f"{os.getuid()}:{os.getgid()}",
            working_dir=code_dir, volumes=volumes, labels=labels, init=True,
            device_requests=device_requests,
            # NCCL over InfiniBand pins memory; only asked for with GPUs (some engines refuse it)
            ulimits=[docker.types.Ulimit(name="memlock", soft=-1, hard=-1)] if slots else None,
        )

    def _wait(self) -> None:
        try:
            self._rc = int(self.container.wait(timeout=None).get("StatusCode", 1))
        except _sdk().errors.APIError as e:
            self._error = f"docker error while running {self.name}: {e.explanation or e}"
        except self._engine_lost as e:
            self._error = f"lost the Docker engine while running {self.name}: {e}"
        except Exception as e:  # noqa: BLE001 - whatever it is, the run's container is no longer watched
            self._error = f"cannot watch container {self.name}: {e}"
        finally:
            self._done.set()

    def poll(self) -> int | None:
        if not self._done.is_set():
            return None
        if self._error is not None:
            raise RunError(self._error)
        return self._rc

    def wait(self, timeout: float) -> int | None:
        self._done.wait(timeout)
        return self.poll()

    def terminate(self, grace: float) -> None:
        threading.Thread(target=self._stop, args=(grace,), name="higgsfield-container-stop", daemon=True).start()

    def _stop(self, grace: float) -> None:
        try:
            with contextlib.closing(client(timeout=grace + 30)) as c:
                c.containers.get(self.name).stop(timeout=int(max(1, grace)))
        except Exception:  # noqa: BLE001, S110 - already gone
            pass

    def kill(self) -> None:
        try:
            with contextlib.closing(client(timeout=30)) as c:
                c.containers.get(self.name).kill()
        except Exception:  # noqa: BLE001, S110 - already gone
            pass

    def cleanup(self) -> None:
        try:
            if getattr(self, "container", None) is not None:
                self.container.remove(force=True)
        except Exception:  # noqa: BLE001, S110 - already gone or the engine is down
            pass
        self.client.close()


def mounts(run: NodeRun, rd: RunDir) -> dict[str, dict[str, str]]:
    """The container's bind mounts (host path -> docker SDK volume), each at its host path (module doc)."""
    code_dir = run.spec.code_dir
    volumes = {
        code_dir: {"bind": code_dir, "mode": "ro"},
        str(rd.path): {"bind": str(rd.path), "mode": "rw"},
        str(_invoker_package_dir()): {"bind": f"{INVOKER_MOUNT}/higgsfield", "mode": "ro"},
    }
    cache = run.placement.cache_dir
    if cache:
        Path(cache).mkdir(parents=True, exist_ok=True)
        volumes[cache] = {"bind": cache, "mode": "rw"}
    mirror = layout.mirror_path(run.spec.checkpoint_mirror)
    if mirror:   # else every upload would land in the container's own filesystem and die with it
        volumes[mirror] = {"bind": mirror, "mode": "rw"}
    data = rd.home.root / layout.data_dir(run.spec.project)
    if data.is_dir():   # the data entries (HIGGSFIELD_DATA_*), at their host paths, read-only
        volumes[str(data)] = {"bind": str(data), "mode": "ro"}
    return volumes


def _requests_errors() -> tuple[type[BaseException], ...]:
    """The transport errors of a Docker engine going away mid-call (requests' connection errors)."""
    import requests

    return (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError)


def _send_secrets(cl: Any, container: Any, secrets: dict[str, str]) -> None:
    """One JSON line to the container's stdin (its launcher waits for it), over an attach; then detach."""
    sock = cl.api.attach_socket(container.id, params={"stdin": 1, "stream": 1})
    try:
        getattr(sock, "_sock", sock).sendall(json.dumps(secrets).encode() + b"\n")
    finally:
        sock.close()


def _remove_stale(cl: Any, name: str) -> None:
    docker = _sdk()
    try:
        cl.containers.get(name).remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as e:
        raise RunError(f"cannot remove the stale container {name}: {e.explanation or e}") from None


def stop_run_containers(rd: RunDir, name: str | None, grace: float = 3.0) -> int:
    """Stop and remove the run's containers (by name and by run-dir label); returns how many."""
    docker = _sdk()
    try:
        cl = client(timeout=grace + 30)
    except RunError:
        return 0
    found: dict[str, Any] = {}
    try:
        if name:
            try:
                c = cl.containers.get(name)
                found[c.id] = c
            except docker.errors.NotFound:
                pass
        for c in cl.containers.list(all=True, filters={"label": f"{LABEL}.run_dir={rd.path}"}):
            found[c.id] = c
        for c in found.values():
            try:
                c.stop(timeout=int(max(1, grace)))
            except docker.errors.APIError:
                pass
            try:
                c.remove(force=True)
            except docker.errors.APIError:
                pass
        return len(found)
    finally:
        cl.close()


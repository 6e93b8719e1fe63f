"""``docker info --format {{json .}}``: what setup and the doctor read of a node's Docker engine, decoded once.

One read answers both questions they ask (does the engine answer, at which version; does it
have the NVIDIA runtime), as JSON the node's Docker prints: :func:`docker_info` decodes it into a
:class:`DockerInfo` (:func:`higgsfield.contract.codec.decode`), never read by key.

Use::

    info = docker_info(await ctx.read(DOCKER_INFO))
    info.ServerVersion, info.nvidia       # "27.3.1", True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from higgsfield.contract.codec import decode
from higgsfield.contract.decode import DecodeError, loads
from higgsfield.control.remote.base import CommandResult

DOCKER_INFO = ("docker", "info", "--format", "{{json .}}")  # one call: the version, the runtimes, the root dir


@dataclass(frozen=True)
class DockerInfo:
    """The part of Docker's answer higgsfield reads (its keys as Docker spells them; the rest is ignored)."""

    WHAT: ClassVar[str] = "docker info"

    ServerVersion: str = ""    # noqa: N815 - Docker's key; "": the engine did not say
    Runtimes: dict[str, Any] = field(default_factory=dict)   # noqa: N815 - Docker's key; name -> its settings

    @property
    def nvidia(self) -> bool:
        """The NVIDIA container runtime is registered: containers can be given the GPUs."""
        return "nvidia" in self.Runtimes


def docker_info(r: CommandResult) -> DockerInfo:
    """``r``'s answer decoded; an empty one when the command failed or its answer is not Docker's."""
    if not r.ok:
        return DockerInfo()
    try:
        return decode(DockerInfo, loads(r.stdout or "{}"))
    except DecodeError:
        return DockerInfo()

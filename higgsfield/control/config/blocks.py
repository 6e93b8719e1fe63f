"""The smaller blocks of ``higgsfield.yml``: docker, install, retention, checkpoint and notify.

Each is a model of its own with its field checks; :mod:`higgsfield.control.config.schema` holds the
whole file's model (:class:`~higgsfield.control.config.schema.Config`), the nodes and SSH, which
use them.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, field_validator

from higgsfield import __version__
from higgsfield.contract.names import check_secret_name, check_text
from higgsfield.contract.notify import DEFAULT_EVENTS, Event
from higgsfield.contract.text import shown
from higgsfield.contract.units import FORMS, duration_s
from higgsfield.control.config.fields import Int
from higgsfield.control.config.fields import Model as _Model
from higgsfield.control.config.fields import checked as _checked

__all__ = ["CheckpointConfig", "DataEntryConfig", "DockerConfig", "InstallConfig", "NotifyConfig",
           "RetentionConfig", "check_data"]


def _pip_source(v: str) -> str:
    check_text(v)
    if v.startswith("-"):
        raise ValueError(f"{shown(v)} starts with '-', which pip would read as an option: give a requirement, "
                         "a git+https:// URL or a path")
    return v


def _index_url(v: str) -> str:
    check_text(v)
    if not re.fullmatch(r"https?://\S+", v):
        raise ValueError(f"{shown(v)} is not an http(s):// URL")
    return v


class DockerConfig(_Model):
    """The training image built on every node."""

    dockerfile: str = Field("Dockerfile", description="Dockerfile, relative to the project.")
    base_image: str | None = Field(None, description="Passed as the BASE_IMAGE build argument when set.")

    _text = _checked("dockerfile", "base_image", check=check_text)


class InstallConfig(_Model):
    """How GitHub Actions jobs install higgsfield (the version that generated them)."""

    source: str = Field(f"higgsfield=={__version__}",
                        description="A pip requirement: 'higgsfield==X', 'git+https://...', a wheel URL.")
    index_url: str | None = Field(None, description="Extra pip index for private installs.")

    _source = _checked("source", check=_pip_source)
    _index = _checked("index_url", check=_index_url)


def _max_age(v: Any) -> Any:
    # One grammar with `logs --since` and `prune --older-than` (higgsfield.contract.units).
    if isinstance(v, str) and (secs := duration_s(v)) is not None and secs > 0:
        return v
    raise ValueError(f"{shown(v)} is not a duration above zero: use {FORMS}")


class RetentionConfig(_Model):
    """What deploy (and a plain ``higgsfield prune``) removes from the nodes so they never fill up.

    Only finished runs (succeeded, failed, killed) ever go: a queued, starting or
    running run is never touched, nor the image of the current release.
    """

    keep_runs: Int | None = Field(None, ge=0, description="Keep this many finished runs per node (the newest); "
                                                          "older ones go.")
    max_age: Annotated[str, BeforeValidator(_max_age)] | None = Field(
        None, description="Finished runs that ended longer ago than this go: 30d, 12h, 90m.")
    checkpoints: bool = Field(False, description="Also remove a removed run's checkpoints (default: never "
                                                 "without asking).")
    images: bool = Field(True, description="Also remove the project's images that no release and no queued or "
                                           "running run uses.")

    @property
    def max_age_s(self) -> float | None:
        return None if self.max_age is None else duration_s(self.max_age)


_MIRROR_SCHEMES = ("s3://", "gs://", "sftp://", "file://")


def _mirror_url(v: str) -> str:
    check_text(v)
    if v.startswith("/") and len(v) > 1 and ".." not in PurePosixPath(v).parts:
        return v
    scheme = next((s for s in _MIRROR_SCHEMES if v.startswith(s)), None)
    rest = v[len(scheme):] if scheme else ""
    if scheme is None or not rest.strip("/") or any(c.isspace() for c in v):
        raise ValueError(f"{shown(v)} is not a mirror URL: use s3://bucket/prefix, gs://bucket/prefix, "
                         "sftp://host/path, file:///path or an absolute path")
    return v


class CheckpointConfig(_Model):
    """Where checkpoints go besides each node's own disk."""

    mirror: str | None = Field(None, description="An fsspec URL (s3://bucket/prefix, gs://, sftp://host/path, "
                                                 "file:///path or /path) each node uploads its part of every "
                                                 "complete checkpoint to, in the background; loads fall back "
                                                 "to it. Credentials and an S3 endpoint are secrets "
                                                 "(AWS_ACCESS_KEY_ID, FSSPEC_S3_ENDPOINT_URL...).")

    _mirror = _checked("mirror", check=_mirror_url)


class NotifyConfig(_Model):
    """Where a run's events are sent from its node 0, laptop or not (:mod:`higgsfield.contract.notify`)."""

    to: list[str] = Field(..., min_length=1,
                          description="Names of secrets whose values are apprise URLs (slack://..., discord://..., "
                                      "mailto://..., ntfy://..., json://host/path for any webhook): their values "
                                      "come from the env file or CI secrets, like the secrets' own.")
    events: list[Event] = Field(list(DEFAULT_EVENTS),
                                description="Which events: started, succeeded, failed, stalled, recovered, lost "
                                            "(default: all but started).")

    @field_validator("to")
    @classmethod
    def _to(cls, v: list[str]) -> list[str]:
        for s in v:
            try:
                check_secret_name(s)
            except ValueError as e:   # most likely the URL itself, which must not be in a committed file
                raise ValueError(f"{e}: list the name of a secret here (SLACK_URL) and put its URL in the env "
                                 "file (SLACK_URL=slack://...)") from None
        if len(set(v)) != len(v):
            raise ValueError("a destination is listed twice")
        return v


def _data_source(v: str) -> str:
    from higgsfield.contract.data import source_kind

    check_text(v)
    source_kind(v)   # ValueError: an unknown scheme, an empty source
    return v


def _data_dest(v: str) -> str:
    from higgsfield.contract.data import check_data_dest

    check_text(v)
    check_data_dest(v)
    return v


class DataEntryConfig(_Model):
    """One entry of ``data:``: where its files come from. Each run sees it read-only at ``params.data[NAME]``."""

    source: str = Field(..., description="A path on this machine (relative to the project), an fsspec URL "
                                         "(s3://bucket/prefix, gs://, https://, sftp://) fetched on a node, or "
                                         "a Hugging Face repo hf://org/name (hf://datasets/org/name).")
    revision: str | None = Field(None, description="The Hub repo's revision (a branch, tag or commit); "
                                                   "only for hf:// sources.")
    dest: str | None = Field(None, description="A path relative to each node's state directory where the "
                                               "current version also appears (a link, swapped atomically); "
                                               "a path outside it is refused.")

    _source = _checked("source", check=_data_source)
    _revision = _checked("revision", check=check_text)
    _dest = _checked("dest", check=_data_dest)

    @property
    def kind(self) -> str:
        from higgsfield.contract.data import source_kind

        return source_kind(self.source)

    def shown_source(self) -> str:
        return self.source + (f"@{self.revision}" if self.revision else "")


def _data_entry(v: Any) -> Any:
    return {"source": v} if isinstance(v, str) else v


DataEntry = Annotated[DataEntryConfig, BeforeValidator(_data_entry)]


def check_data(v: dict[str, DataEntryConfig]) -> dict[str, DataEntryConfig]:
    """Entry names (they become directories and ``HIGGSFIELD_DATA_<NAME>``): valid, and unique ignoring case."""
    from higgsfield.contract.data import check_data_name

    seen: dict[str, str] = {}
    for name, entry in v.items():
        check_data_name(name)
        if name.upper() in seen:
            raise ValueError(f"entry {shown(name)} is {shown(seen[name.upper()])} again (one variable "
                             f"HIGGSFIELD_DATA_{name.upper()}): give each entry its own name")
        seen[name.upper()] = name
        if entry.dest is not None:
            dest = entry.dest.rstrip("/")
            clash = next((n for n, e in v.items() if n != name and e.dest is not None and (
                e.dest.rstrip("/") == dest or e.dest.startswith(dest + "/"))), None)
            if clash is not None:
                raise ValueError(f"entry {shown(name)}: dest {shown(entry.dest)} is also entry {shown(clash)}'s "
                                 "(or holds it): give each entry its own dest")
        if entry.revision is not None and entry.kind != "hub":
            raise ValueError(f"entry {shown(name)}: revision is for hf:// sources; remove it, or pin the "
                             "source itself")
    return v

"""Data manifests and sources: the version is the content's, paths stay inside the entry, schemes are known."""

from __future__ import annotations

import pytest

from higgsfield.contract.codec import decode
from higgsfield.contract.data import DataFile, Manifest, source_kind
from higgsfield.contract.decode import DecodeError

SHA = "0" * 64


def test_version_is_the_contents() -> None:
    a = Manifest(files=[DataFile(path="a", size=1, sha256=SHA)])
    b = Manifest(files=[DataFile(path="a", size=1, sha256="1" * 64)])
    assert a.version() != b.version() and a.version() == Manifest(files=list(a.files)).version()


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../b", "a//b", "", "./a"])
def test_a_path_outside_the_entry_is_refused(path: str) -> None:
    with pytest.raises(DecodeError):
        decode(Manifest, {"files": [{"path": path, "size": 1, "sha256": SHA}]})


def test_a_file_that_is_also_a_directory_is_refused() -> None:
    with pytest.raises(DecodeError, match="both a file and a directory"):
        decode(Manifest, {"files": [{"path": "a", "size": 1, "sha256": SHA}, {"path": "a/b", "size": 1, "sha256": SHA}]})


@pytest.mark.parametrize(("source", "kind"), [("./data", "path"), ("/abs", "path"), ("s3://b/p", "url"),
                                              ("hf://org/model", "hub"), ("hf://datasets/org/d", "hub")])
def test_source_kinds(source: str, kind: str) -> None:
    assert source_kind(source) == kind


@pytest.mark.parametrize("source", ["ftp2://x/y", "s3://", "hf://justone", ""])
def test_bad_sources(source: str) -> None:
    with pytest.raises(ValueError):
        source_kind(source)

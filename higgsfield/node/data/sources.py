"""A URL or Hugging Face Hub source downloaded on this node, stored and made current (``invoker data ingest``).

One node downloads and the others copy from it over their own network
(:mod:`higgsfield.node.data.peer`): the bucket or the Hub is read once per push instead of
once per node (no N-fold egress, no rate limit hit N times), and every node ends with the
very bytes the first one got, where N separate downloads of a moving ``main`` could differ.

- ``s3://``, ``gs://``, ``https://``, ``sftp://``, ``file://``: fsspec (``s3://`` needs s3fs on
  the node: the ``mirror`` extra). An S3 endpoint (MinIO, moto) is the secret
  ``FSSPEC_S3_ENDPOINT_URL``, the keys ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``.
- ``hf://org/name`` (``hf://datasets/org/name``): ``huggingface_hub.snapshot_download`` at the
  entry's ``revision``; ``HF_TOKEN`` and ``HF_ENDPOINT`` are secrets like any other.

The secrets arrive on stdin (:class:`~higgsfield.contract.data.IngestRequest`) and are set in
this process's environment only, for the download.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from pathlib import Path

from higgsfield.contract import layout
from higgsfield.contract.data import (
    HUB_SCHEME,
    CommitRequest,
    DataError,
    DataFile,
    IngestReply,
    IngestRequest,
    Manifest,
    source_kind,
)
from higgsfield.node.data.store import CHUNK, INCOMING, Store

S3_ENDPOINT_VAR = "FSSPEC_S3_ENDPOINT_URL"   # fsspec's own setting: MinIO, moto, any S3 API
HF_TOKEN_VAR = "HF_TOKEN"


def ingest(store: Store, name: str, req: IngestRequest) -> IngestReply:
    """Download ``req.source`` into a private scratch directory, store its files, commit them as ``name``."""
    try:
        kind = source_kind(req.source)
    except ValueError as e:
        raise DataError(f"data '{name}': source {e}") from None
    if kind == "path":
        raise DataError(f"data '{name}': a laptop path is pushed from the laptop, not downloaded here")
    os.environ.update(req.secrets)
    store.make()
    scratch = store.root / f".download-{secrets.token_hex(6)}"
    scratch.mkdir(mode=0o700)
    try:
        try:
            if kind == "hub":
                _hub(req, scratch)
            else:
                _fsspec(req, scratch)
        except DataError:
            raise
        except Exception as e:  # noqa: BLE001 (any backend's error is the download's: one line)
            raise DataError(f"data '{name}': downloading {req.source} failed: {type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''}") from None
        manifest = _adopt(store, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not manifest.files:
        raise DataError(f"data '{name}': {req.source} holds no files")
    source = req.source + (f"@{req.revision}" if req.revision else "")
    done = store.commit(CommitRequest(name=name, manifest=manifest, source=source, dest=req.dest))
    return IngestReply(manifest=manifest, current=done.current, path=done.path)


def _hub(req: IngestRequest, dest: Path) -> None:
    from huggingface_hub import snapshot_download

    rest = req.source[len(HUB_SCHEME) + 3:]
    repo_type = "model"
    for prefix, kind in (("datasets/", "dataset"), ("models/", "model")):
        if rest.startswith(prefix):
            rest, repo_type = rest[len(prefix):], kind
    snapshot_download(repo_id=rest, repo_type=repo_type, revision=req.revision or None, local_dir=str(dest),
                      token=os.environ.get(HF_TOKEN_VAR) or None)
    shutil.rmtree(dest / layout.HUB_META, ignore_errors=True)   # huggingface_hub's own bookkeeping, not the repo's


def _fsspec(req: IngestRequest, dest: Path) -> None:
    import fsspec

    endpoint = os.environ.get(S3_ENDPOINT_VAR)
    opts = {"client_kwargs": {"endpoint_url": endpoint}} if req.source.startswith("s3://") and endpoint else {}
    fs, path = fsspec.core.url_to_fs(req.source, **opts)
    if fs.isdir(path):
        base = path.rstrip("/")
        for f in fs.find(base):
            rel = f[len(base):].lstrip("/")
            if rel:
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(f, str(target))
    elif fs.exists(path):
        fs.get_file(path, str(dest / Path(path).name))
    else:
        raise DataError(f"{req.source} does not exist")


def _adopt(store: Store, scratch: Path) -> Manifest:
    """Every file under ``scratch`` into the object store (hashed here, renamed in), as a manifest."""
    files = []
    for p in sorted(scratch.rglob("*")):
        if p.is_symlink() or not p.is_file():
            continue
        h = hashlib.sha256()
        with open(p, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        sha, size = h.hexdigest(), p.stat().st_size
        files.append(DataFile(path=p.relative_to(scratch).as_posix(), size=size, sha256=sha))
        if not store.has(sha, size):
            dest = store.object_path(sha)
            dest.parent.mkdir(mode=0o700, exist_ok=True)
            tmp = store.objects / INCOMING / f"{sha}.{secrets.token_hex(4)}"
            os.replace(p, tmp)
            tmp.chmod(0o444)
            os.replace(tmp, dest)
    return Manifest(files=sorted(files, key=lambda f: f.path))

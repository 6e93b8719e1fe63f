"""A URL entry downloaded on a node (``invoker data ingest``): an ``s3://`` prefix from moto's S3 server on
loopback, its credentials and endpoint given as secrets (stdin), stored, made current, and its manifest the
one the other nodes copy; a ``file://`` URL the same way. hf:// (from a local Hub endpoint): test_data_hub.py."""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

import pytest

from higgsfield.contract.data import DataError, IngestRequest
from higgsfield.node.data.sources import ingest
from higgsfield.node.data.store import Store
from higgsfield.node.state.home import NodeState

pytestmark = pytest.mark.timeout(120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_s3_prefix_from_moto(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        secrets = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing-secret",
                   "FSSPEC_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_DEFAULT_REGION": "us-east-1"}
        for k in secrets:
            monkeypatch.delenv(k, raising=False)   # ingest sets them in its own process: undone after
        s3 = boto3.client("s3", endpoint_url=secrets["FSSPEC_S3_ENDPOINT_URL"], aws_access_key_id="testing",
                          aws_secret_access_key="testing-secret", region_name="us-east-1")
        s3.create_bucket(Bucket="corpus-bucket")
        blobs = {"data/train/a.jsonl": os.urandom(50_000), "data/train/sub/b.jsonl": b"hello"}
        for key, body in blobs.items():
            s3.put_object(Bucket="corpus-bucket", Key=key, Body=body)
        store = Store(NodeState(tmp_path), "demo")
        got = ingest(store, "corpus", IngestRequest(source="s3://corpus-bucket/data/train", secrets=secrets))
        assert [f.path for f in got.manifest.files] == ["a.jsonl", "sub/b.jsonl"]
        assert got.manifest.files[0].sha256 == hashlib.sha256(blobs["data/train/a.jsonl"]).hexdigest()
        assert store.current("corpus") == got.current
        assert (Path(got.path) / "sub" / "b.jsonl").read_bytes() == b"hello"
        assert not list(store.root.glob(".download-*"))     # the scratch directory is gone
        with pytest.raises(DataError, match="does not exist"):
            ingest(store, "other", IngestRequest(source="s3://corpus-bucket/nothing-here", secrets=secrets))
    finally:
        server.stop()


def test_file_url(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"weights")
    store = Store(NodeState(tmp_path / "node"), "demo")
    got = ingest(store, "weights", IngestRequest(source=f"file://{src}"))
    assert (Path(got.path) / "w.bin").read_bytes() == b"weights"

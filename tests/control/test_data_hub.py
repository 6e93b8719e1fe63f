"""A Hugging Face Hub entry (``hf://org/name`` with a ``revision``) pushed through ``huggingface_hub``.

No Hub is reachable here, so the test serves the part of the Hub's HTTP API that
``snapshot_download`` (huggingface_hub 2.x) uses, from a stdlib server on loopback: the revision's
info (``/api/models/<repo>/revision/<rev>``: its commit sha), its file tree
(``/api/models/<repo>/tree/<sha>?recursive=true``) and each file (``/<repo>/resolve/<sha>/<path>``, with
the ``ETag`` and ``X-Repo-Commit`` headers). ``HF_ENDPOINT`` points there; it is a secret of the project
(``secrets:`` and the env file), so it reaches the node on stdin like a token would. The node is
``localhost`` (the invoker is this Python, the state a temporary directory): the push has node 0
download the revision, store it and make it current, and the entry holds the files of that revision
and nothing of huggingface_hub's own bookkeeping.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest

pytestmark = pytest.mark.timeout(90)

REPO = "org/tiny"
REVISIONS = {"main": {"config.json": b'{"v": 2}', "w/model.bin": b"W" * 3000},
             "v1": {"config.json": b'{"v": 1}', "w/model.bin": b"w" * 2000}}


def _commit(rev: str) -> str:
    return hashlib.sha1(rev.encode()).hexdigest()  # noqa: S324 (a made-up commit id, not security)


def _rev(given: str) -> str:
    return next((r for r in REVISIONS if given in (r, _commit(r))), given)


class _Hub(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        self.server.seen.append(f"{self.command} {self.path}")  # type: ignore[attr-defined]

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _send(self, code: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _serve(self, body: bool) -> None:
        parts = unquote(self.path.split("?")[0]).strip("/").split("/")
        if parts[:2] == ["api", "models"] and "/".join(parts[2:4]) == REPO:   # revision info, or its tree
            rev = _rev("/".join(parts[5:]))
            files = REVISIONS.get(rev)
            if files is None:
                self._send(404, b"{}", {"X-Error-Code": "RevisionNotFound"}, body)
            elif parts[4] == "tree":
                tree = [{"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}  # noqa: S324
                        for p, b in sorted(files.items())]
                self._send(200, json.dumps(tree).encode(), {"Content-Type": "application/json"}, body)
            else:
                info = {"id": REPO, "sha": _commit(rev), "siblings": [{"rfilename": p} for p in sorted(files)]}
                self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
            return
        if "/".join(parts[:2]) == REPO and parts[2:3] == ["resolve"]:               # one file of a revision
            rev, path = _rev(parts[3]), "/".join(parts[4:])
            data = REVISIONS.get(rev, {}).get(path)
            if data is not None:
                self._send(200, data, {"ETag": f'"{hashlib.sha1(data).hexdigest()}"',  # noqa: S324
                                       "X-Repo-Commit": _commit(rev)}, body)
                return
        self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, body)


@pytest.fixture
def hub() -> Iterator[ThreadingHTTPServer]:
    pytest.importorskip("huggingface_hub")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    server.seen = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _project(tmp_path: Path, hub: ThreadingHTTPServer, revision: str) -> Path:
    (tmp_path / "higgsfield.yml").write_text(
        f"name: t\nnodes:\n  - host: localhost\nstate_dir: {tmp_path}/state\nsecrets: [HF_ENDPOINT]\n"
        f"data:\n  weights: {{source: hf://{REPO}, revision: {revision}}}\n")
    (tmp_path / "env").write_text(f"HF_ENDPOINT=http://127.0.0.1:{hub.server_address[1]}\n")
    return tmp_path / "state" / "data" / "t" / "entries" / "weights" / "current"


def _push(d: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "higgsfield", "data", "push", "--json"], cwd=d,
                          capture_output=True, text=True, timeout=80)


def test_a_hub_entry_at_a_revision(tmp_path: Path, hub: ThreadingHTTPServer) -> None:
    current = _project(tmp_path, hub, "v1")
    r = _push(tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["entries"][0]["source"] == f"hf://{REPO}@v1" and got["entries"][0]["files"] == 2
    files = sorted(p.relative_to(current).as_posix() for p in current.rglob("*") if p.is_file())
    assert files == ["config.json", "w/model.bin"]                       # no .cache of huggingface_hub's
    assert (current / "config.json").read_bytes() == REVISIONS["v1"]["config.json"]
    assert (current / "w" / "model.bin").read_bytes() == REVISIONS["v1"]["w/model.bin"]
    assert any(f"/resolve/{_commit('v1')}/" in s for s in hub.seen) and not any(
        _commit("main") in s for s in hub.seen)                           # the pinned revision, not main

    _project(tmp_path, hub, "nosuch")                                      # a revision the repo lacks
    r = _push(tmp_path)
    assert r.returncode == 2 and "weights" in r.stderr and "RevisionNotFound" in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1
    assert (current / "config.json").read_bytes() == REVISIONS["v1"]["config.json"]   # the old version stays

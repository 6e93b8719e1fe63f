"""Malformed requests to a real ``higgsfield ui`` get a 4xx, never a 500 (issue 22, item 5).

One dashboard of a project whose node is ``localhost`` (a subprocess, as a user starts
it), spoken to over raw sockets on loopback, so a request can be anything a client can
put on the wire: a path with U+2028, ``%FF`` or raw high bytes, an overlong path, a
100,000-deep JSON body, a 20 MiB body, the wrong content type, a method the dashboard
does not have, too many query fields. The token's redirect never leaves the server's
root, and event streams are bounded per client: one over the limit is a 429, and after
many opened and closed the server still answers. Fifty at once from one address are all served.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from ui_helpers import Dashboard, dashboard  # noqa: E402

from higgsfield.control.ui.app import MAX_STREAMS_PER_CLIENT  # noqa: E402
from higgsfield.control.ui.security import MAX_BODY, cookie_name, csrf_token  # noqa: E402

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    base = tmp_path_factory.mktemp("uibad")
    proj = base / "uibad"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "exp.py").write_text('from higgsfield.experiment import experiment, param\n\n\n'
                                         '@experiment("exp")\n@param("steps", default=3)\n'
                                         'def exp(params):\n    pass\n')
    (proj / "higgsfield.yml").write_text("name: uibad\nnodes:\n  - host: localhost\nnproc_per_node: 1\n"
                                         f"runtime: process\nstate_dir: {base / 'state'}\n")
    with dashboard(proj) as d:
        yield d
        assert not any("Traceback" in line for line in d.stderr), "".join(d.stderr)[-3000:]


def connect(d: Dashboard) -> socket.socket:
    return socket.create_connection(("127.0.0.1", d.port), timeout=20)


def head(d: Dashboard, method: str, target: bytes, headers: dict[str, str] | None = None, *,
         cookie: bool = True, body: bytes = b"") -> bytes:
    lines = [method.encode() + b" " + target + b" HTTP/1.1", f"Host: 127.0.0.1:{d.port}".encode(),
             b"Connection: close"]
    if cookie:
        lines.append(f"Cookie: {cookie_name(d.port)}={d.token}".encode())
    lines += [f"{k}: {v}".encode() for k, v in (headers or {}).items()]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def read_response(sock: socket.socket, method: str = "GET") -> http.client.HTTPResponse:
    resp = http.client.HTTPResponse(sock, method=method)
    resp.begin()
    return resp


def ask(d: Dashboard, method: str, target: bytes, headers: dict[str, str] | None = None, *,
        cookie: bool = True, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One request as raw bytes on a new connection; the status, headers (lower-case) and body."""
    with connect(d) as s:
        s.sendall(head(d, method, target, headers, cookie=cookie, body=body))
        resp = read_response(s, method)
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


def post_headers(d: Dashboard, **extra: str) -> dict[str, str]:
    return {"X-HF-CSRF": csrf_token(d.token), "Content-Type": "application/json", **extra}


def assert_4xx(status: int, what: object) -> None:
    assert 400 <= status < 500, f"{what}: {status}"


def test_the_dashboard_answers_normally(ui: Dashboard) -> None:
    status, _, body = ask(ui, "GET", b"/api/session")
    assert status == 200 and json.loads(body)["project"] == "uibad"


@pytest.mark.parametrize("target", [
    b"/%E2%80%A8",                       # U+2028, percent-encoded
    b"/api/runs/a%E2%80%A8b/events",
    b"/static/%E2%80%A8.js",
    b"/api/experiments/%E2%80%A9/form",
    b"/%FF", b"/static/%FF%FE", b"/api/runs/%FF/kill", b"/%00", b"/a%0D%0Ab", b"/%1B[31m",
    "/\u2028".encode(), b"/\xff\xfe", b"/api/runs/\xc3\xa9/events",   # raw bytes on the wire
    b"/" + b"a" * 9000,                          # overlong
    b"/api/runs/" + b"%E2%80%A8" * 500 + b"/events",
])
@pytest.mark.parametrize("cookie", [True, False])
def test_non_latin_and_overlong_paths_get_a_4xx(ui: Dashboard, target: bytes, cookie: bool) -> None:
    status, _, _ = ask(ui, "GET", target, cookie=cookie)
    assert_4xx(status, target[:60])


def test_a_path_longer_than_the_server_reads_gets_a_4xx(ui: Dashboard) -> None:
    with connect(ui) as s:
        s.sendall(head(ui, "GET", b"/" + b"x" * 200_000))
        try:
            resp = read_response(s)
        except (ConnectionError, http.client.RemoteDisconnected):
            return                                # uvicorn's HTTP parser refused the line: no 500 either
        assert_4xx(resp.status, "a 200 KB path")


@pytest.mark.parametrize("body", [
    b"[" * 100_000,
    b'{"experiment": ' * 50_000,
    json.dumps({"experiment": "exp", "values": {"steps": 3}, "x": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}).encode(),
    b"not json", b"\xff\xfe\x00", b"", b'{"experiment": "exp", "values": [1]}',
    b'{"experiment": "exp", "values": {"steps": [1, 2]}}', b'{"experiment": "exp", "values": {"nope": 1}}',
    b'{"experiment": "no_such", "values": {}}', b'{"experiment": 1e400}', b'{"experiment": "' + b"9" * 5000 + b'"}',
])
def test_deep_or_broken_json_gets_a_400(ui: Dashboard, body: bytes) -> None:
    headers = post_headers(ui, **{"Content-Length": str(len(body))})
    status, hdrs, data = ask(ui, "POST", b"/api/runs", headers, body=body)
    assert status == 400, (body[:60], status, data[:200])
    assert hdrs["content-type"].startswith("application/json") and json.loads(data)["error"]


def test_a_20_mib_body_gets_a_413_before_it_is_sent(ui: Dashboard) -> None:
    size = 20 << 20
    with connect(ui) as s:
        s.sendall(head(ui, "POST", b"/api/runs", post_headers(ui, **{"Content-Length": str(size)})))
        resp = read_response(s)         # answered on the declared length alone
        assert resp.status == 413, resp.read()[:200]


def test_a_chunked_body_over_the_cap_gets_a_413(ui: Dashboard) -> None:
    chunk = b"[" * (64 << 10)
    with connect(ui) as s:
        s.sendall(head(ui, "POST", b"/api/runs", post_headers(ui, **{"Transfer-Encoding": "chunked"})))
        sent = 0
        while sent <= MAX_BODY + len(chunk):
            s.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            sent += len(chunk)
        resp = read_response(s)
        assert resp.status == 413, resp.read()[:200]


def test_a_body_cut_off_midway_is_no_error(ui: Dashboard) -> None:
    for _ in range(5):
        with connect(ui) as s:
            s.sendall(head(ui, "POST", b"/api/runs", post_headers(ui, **{"Content-Length": "1000"}),
                           body=b'{"experiment": '))
    status, _, _ = ask(ui, "GET", b"/api/session")
    assert status == 200


@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x",
                                  "application/jsonp", "", "\u2028"])
def test_a_body_of_another_content_type_gets_a_415(ui: Dashboard, kind: str) -> None:
    body = b'{"experiment": "exp", "values": {}, "check": true}'
    headers = {"X-HF-CSRF": csrf_token(ui.token), "Content-Length": str(len(body))}
    if kind:
        headers["Content-Type"] = kind
    with connect(ui) as s:
        s.sendall(head(ui, "POST", b"/api/runs", headers, body=body).replace("\u2028".encode("utf-8"), b"\xe2\x80\xa8"))
        resp = read_response(s)
        assert resp.status == 415, (kind, resp.status)


def test_the_right_content_type_still_works(ui: Dashboard) -> None:
    body = b'{"experiment": "exp", "values": {"steps": 4}, "check": true}'
    status, _, data = ask(ui, "POST", b"/api/runs",
                          post_headers(ui, **{"Content-Type": "application/json; charset=utf-8",
                                              "Content-Length": str(len(body))}), body=body)
    assert status == 200, data
    assert json.loads(data)["params"]["steps"] == 4


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "FOO", "CONNECT"])
def test_unknown_methods_get_a_405(ui: Dashboard, method: str) -> None:
    target = b"127.0.0.1:1" if method == "CONNECT" else b"/api/runs"
    status, hdrs, _ = ask(ui, method, target, {"X-HF-CSRF": csrf_token(ui.token)})
    if method == "CONNECT":
        assert_4xx(status, method)
    else:
        assert status == 405, method
        assert "POST" in hdrs.get("allow", "")


@pytest.mark.parametrize("target", [
    b"/api/experiments/exp/form?run=%FF%00%E2%80%A8",
    b"/api/experiments/%2E%2E/form",
    b"/api/experiments/exp/form?" + b"&".join(b"a%d=1" % i for i in range(500)),
    b"/api/session?" + b"x" * 20_000,
    b"/api/runs/..%2F..%2Fetc/events",
    b"/api/runs/" + b"a" * 300 + b"/events",
])
def test_bad_query_params_and_names_get_a_4xx(ui: Dashboard, target: bytes) -> None:
    status, _, _ = ask(ui, "GET", target)
    assert_4xx(status, target[:60])


def test_a_good_query_still_works(ui: Dashboard) -> None:
    status, _, data = ask(ui, "GET", b"/api/experiments/exp/form?run=nope")
    assert status == 200 and json.loads(data)["experiment"] == "exp"


@pytest.mark.parametrize("target", [
    b"/%5Cevil.example/", b"/%5C%5Cevil.example/", b"//evil.example/", b"///evil.example",
    b"/%2F%2Fevil.example/", b"/%5C/evil.example", b"/\\evil.example/", b"/.//evil.example", b"/%09/evil.example",
    b"/static/%5C%5Cevil.example", b"/%E2%80%A8", b"/%FF", b"/\xe2\x80\xa8",
])
def test_the_token_redirect_goes_to_the_root_only(ui: Dashboard, target: bytes) -> None:
    status, hdrs, _ = ask(ui, "GET", target + f"?token={ui.token}".encode(), cookie=False)
    if status == 303:
        assert hdrs["location"] == "/", (target, hdrs["location"])
        assert hdrs["set-cookie"].startswith(f"{cookie_name(ui.port)}={ui.token};")
    else:
        assert_4xx(status, target)          # refused before the token is looked at: no redirect at all
        assert "location" not in hdrs


def test_the_redirect_keeps_other_params_relative_to_the_root(ui: Dashboard) -> None:
    status, hdrs, _ = ask(ui, "GET", f"/?token={ui.token}&next=//evil.example&x=%5C".encode(), cookie=False)
    assert status == 303
    loc = hdrs["location"]
    assert loc.startswith("/?") and not loc.startswith("//") and "\\" not in loc, loc
    assert loc == "/?next=%2F%2Fevil.example&x=%5C"


def open_stream(d: Dashboard, target: bytes = b"/api/events") -> tuple[socket.socket, int]:
    """An event stream's connection (left open) and its status."""
    s = connect(d)
    s.sendall(head(d, "GET", target).replace(b"Connection: close", b"Accept: text/event-stream"))
    resp = read_response(s)
    if resp.status == 200:
        first = resp.read1(100) if hasattr(resp, "read1") else resp.read(10)
        assert first.startswith(b"retry:")
    return s, resp.status


def test_fifty_event_streams_at_once_are_all_answered_without_a_thread_each(ui: Dashboard) -> None:
    """Several tabs, or a team on one dashboard through one tunnel (one address): every stream is served
    at once, not 8 of them while the rest wait, and an idle stream holds no thread of the server."""
    import psutil

    server = psutil.Process(ui.proc.pid)
    idle = server.num_threads()
    socks = [connect(ui) for _ in range(50)]
    try:
        for s in socks:   # all asked before any answer is read
            s.sendall(head(ui, "GET", b"/api/events").replace(b"Connection: close", b"Accept: text/event-stream"))
        for s in socks:
            resp = read_response(s)
            assert resp.status == 200 and resp.read1(100).startswith(b"retry:"), resp.status
        assert server.num_threads() <= idle + 2, (idle, server.num_threads())
        assert ask(ui, "GET", b"/api/session")[0] == 200
    finally:
        for s in socks:
            s.close()


def test_event_streams_are_bounded_per_client_and_do_not_leak(ui: Dashboard) -> None:
    for _round in range(3):
        streams = open_all(ui)
        try:
            extra, status = open_stream(ui)
            extra.close()
            assert status == 429
            extra, status = open_stream(ui, b"/api/runs/some-run/events")   # a run's stream counts too
            extra.close()
            assert status == 429
            status, _, _ = ask(ui, "GET", b"/api/session")                 # other requests are unaffected
            assert status == 200
        finally:
            for s in streams:
                s.close()
    # many short-lived streams (closed at once, some before their first byte, some HEAD) leave nothing behind
    for _ in range(20):
        assert ask(ui, "HEAD", b"/api/events")[0] in (200, 429)
    for _ in range(60):
        s = connect(ui)
        s.sendall(head(ui, "GET", b"/api/events"))
        s.close()
    for s in open_all(ui):                               # the server noticed every one of them closing
        s.close()
    for s in open_all(ui):
        s.close()
    for _ in range(3):            # an unknown run's stream (the page waits FIND_WAIT_S for it): 404, its slot back
        assert answer_once_free(ui, b"/api/runs/no-such-run/events") == 404
    streams = open_all(ui, timeout=2)                    # the 404s held no place
    for s in streams:
        s.close()
    status, _, _ = ask(ui, "GET", b"/api/session")
    assert status == 200


def answer_once_free(d: Dashboard, target: bytes, timeout: float = 10) -> int:
    """The status of GET ``target`` once it is not a 429 (the server noticing streams just closed)."""
    deadline = time.monotonic() + timeout
    while (status := ask(d, "GET", target)[0]) == 429 and time.monotonic() < deadline:
        time.sleep(0.1)
    return status


def open_all(d: Dashboard, timeout: float = 20) -> list[socket.socket]:
    """``MAX_STREAMS_PER_CLIENT`` open streams, waiting for the server to notice streams closed just before."""
    deadline = time.monotonic() + timeout
    while True:
        streams: list[socket.socket] = []
        for _ in range(MAX_STREAMS_PER_CLIENT):
            s, status = open_stream(d)
            streams.append(s)
            if status != 200:
                break
        else:
            return streams
        for s in streams:
            s.close()
        assert time.monotonic() < deadline, "closed event streams still hold their places"
        time.sleep(0.3)


def test_nothing_was_a_500(ui: Dashboard, tmp_path: Path) -> None:
    """Last: the server is alive and printed no traceback for anything above (checked again at teardown)."""
    assert ui.proc.poll() is None
    status, _, _ = ask(ui, "GET", b"/")
    assert status == 200
    assert not any("Traceback" in line or "Exception in ASGI" in line for line in ui.stderr), \
        "".join(ui.stderr)[-3000:]

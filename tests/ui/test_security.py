"""The dashboard's guard, through a real ASGI client: token, cookie, CSRF, Host and Origin, headers.

A tiny Starlette app stands behind the real :class:`~higgsfield.control.ui.security.Guard`,
so these tests pin what any route of the dashboard gets, without nodes.
"""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from higgsfield.control.ui.security import CSRF_HEADER, Guard, cookie_name, csrf_token  # noqa: E402

pytestmark = pytest.mark.timeout(30)
TOKEN = "t0ken-for-tests-only"
PORT = 8765
BASE = f"http://127.0.0.1:{PORT}"


def _app() -> Guard:
    calls: list[str] = []

    async def page(request: Request) -> JSONResponse:
        calls.append(request.method)
        return JSONResponse({"ok": True})

    inner = Starlette(routes=[Route("/", page), Route("/api/x", page, methods=["GET", "POST"])])
    return Guard(inner, token=TOKEN, port=PORT, hosts={"127.0.0.1", "localhost"})


@pytest.fixture()
def client() -> TestClient:
    return TestClient(_app(), base_url=BASE, follow_redirects=False)


def _logged_in(client: TestClient) -> TestClient:
    r = client.get(f"/?token={TOKEN}")
    assert r.status_code == 303
    return client


def test_no_token_no_page(client: TestClient) -> None:
    for path in ("/", "/api/x", "/static/app.js"):
        r = client.get(path)
        assert r.status_code == 403, path
        assert "token" in r.text
    assert client.get("/?token=wrong").status_code == 403


def test_the_url_token_becomes_a_strict_cookie_and_leaves_the_address_bar(client: TestClient) -> None:
    r = client.get(f"/?token={TOKEN}&x=1")
    assert r.status_code == 303
    assert r.headers["location"] == "/?x=1"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{cookie_name(PORT)}={TOKEN};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert client.get("/").status_code == 200


def test_a_state_change_needs_the_csrf_header(client: TestClient) -> None:
    _logged_in(client)
    assert client.post("/api/x").status_code == 403                                   # no header
    assert client.post("/api/x", headers={CSRF_HEADER: "nope"}).status_code == 403    # a wrong one
    assert client.post("/api/x", headers={CSRF_HEADER: TOKEN}).status_code == 403     # the token is not the CSRF
    assert client.post("/api/x", headers={CSRF_HEADER: csrf_token(TOKEN)}).status_code == 200


def test_the_token_in_the_url_does_not_authorize_a_post(client: TestClient) -> None:
    r = client.post(f"/api/x?token={TOKEN}", headers={CSRF_HEADER: csrf_token(TOKEN)})
    assert r.status_code == 403


def test_another_origin_or_host_is_refused(client: TestClient) -> None:
    _logged_in(client)
    good = {CSRF_HEADER: csrf_token(TOKEN)}
    assert client.post("/api/x", headers={**good, "origin": "http://evil.example"}).status_code == 403
    assert client.post("/api/x", headers={**good, "origin": BASE}).status_code == 200
    # DNS rebinding: a name of another site that resolves to 127.0.0.1
    assert client.get("/", headers={"host": f"evil.example:{PORT}"}).status_code == 403


def test_every_answer_carries_the_strict_headers(client: TestClient) -> None:
    for r in (client.get("/"), _logged_in(client).get("/api/x")):
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["referrer-policy"] == "no-referrer"
    assert client.get("/api/x").headers["cache-control"] == "no-store"

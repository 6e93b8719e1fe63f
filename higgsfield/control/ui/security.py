"""Who may use the dashboard: the token in its URL, then a cookie; CSRF and Host checks on every request.

The dashboard can stop and start training runs, so it is guarded like a Jupyter
server, plus what a page that changes state needs:

- ``higgsfield ui`` prints a URL carrying a random token (``?token=...``). The first
  request with it sets a cookie (HttpOnly, SameSite=Strict, named after the port:
  cookies are not kept apart by port) and redirects to the same URL without the
  token, so it stays out of the history and of any Referer. Any request without
  the cookie or the token is refused (403), static files included.
- A request that changes state (any method but GET/HEAD) must also carry the page's
  CSRF token in the ``X-HF-CSRF`` header (a custom header: a form on another site
  cannot send one, and a cross-origin script needs a CORS preflight this server never
  grants), and its ``Origin``, when sent, must be this server's.
- The ``Host`` header must name this server (DNS rebinding: a page of another site
  whose name resolves to 127.0.0.1 otherwise reaches the dashboard as same-origin).
- Every response says ``Content-Security-Policy: default-src 'self'`` (no inline
  script, no other origin), no framing, no referrer, no caching of the API.
- A malformed request is answered here with a 4xx before any route sees it: a path
  that is not printable ASCII (every path of the dashboard is; U+2028 or a stray
  ``%FF`` is not a request of the page) 400, an overlong path or query 414, a method
  the dashboard does not have 405, a declared body over ``MAX_BODY`` 413.
- The token's redirect goes to this server's root, ``/``, whatever path the URL had: a
  path such as ``/%5Cevil.example/`` (``\\``) or ``//evil.example`` would otherwise be a
  Location that a browser reads as another origin.

The CSRF token is an HMAC of the session token: knowing it does not give the token.
No secret of the project (its ``env`` values, SSH keys) is ever part of a response.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Header = tuple[bytes, bytes]

CSRF_HEADER = "x-hf-csrf"
SAFE_METHODS = frozenset({"GET", "HEAD"})
METHODS = SAFE_METHODS | {"POST"}     # all the dashboard has: anything else is a 405
MAX_PATH = 2048                        # bytes of the raw path (a run name is at most a few dozen)
MAX_QUERY = 8192                       # bytes of the query string
MAX_QUERY_FIELDS = 64
MAX_BODY = 1 << 20                     # bytes of a request body: a form of a few fields is ~1 KiB
HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; "
     b"base-uri 'none'; form-action 'self'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def csrf_token(token: str) -> str:
    return hmac.new(token.encode(), b"higgsfield-ui-csrf", hashlib.sha256).hexdigest()


def cookie_name(port: int) -> str:
    return f"hf_ui_{port}"


class Guard:
    """ASGI middleware: refuses what lacks the token, the CSRF header, or names another host."""

    def __init__(self, app: ASGIApp, *, token: str, port: int, hosts: set[str]) -> None:
        self.app = app
        self.token = token
        self.csrf = csrf_token(token)
        self.port = port
        self.cookie = cookie_name(port)
        self.hosts = {h.lower() for h in hosts}

    def allowed_host(self, host: str) -> bool:
        host = host.lower()
        return host in self.hosts or host in {f"{h}:{self.port}" for h in self.hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        method = scope.get("method", "GET")
        host = headers.get("host", "")
        if not self.allowed_host(host):
            await _deny(send, "this dashboard answers only to the address 'higgsfield ui' printed")
            return
        refused = malformed(scope, method, headers)
        if refused is not None:
            await _answer(send, *refused)
            return
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), max_num_fields=MAX_QUERY_FIELDS))
        given = query.get("token")
        if given is not None and _same(given, self.token) and method in SAFE_METHODS:
            # Trade the URL's token for the cookie, and drop it from the address bar. The redirect goes
            # to the root only: a path from the URL ("/\\host", "//host") could name another origin.
            rest = urlencode({k: v for k, v in query.items() if k != "token"})
            await _redirect(send, "/" + (f"?{rest}" if rest else ""),
                            f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict")
            return
        if not _same(_cookie(headers.get("cookie", ""), self.cookie), self.token):
            await _deny(send, "open the URL with the token that 'higgsfield ui' printed")
            return
        if method not in SAFE_METHODS:
            origin = headers.get("origin")
            if origin is not None and not (origin.startswith("http://") and self.allowed_host(origin[7:])):
                await _deny(send, "cross-origin request refused")
                return
            if not _same(headers.get(CSRF_HEADER, ""), self.csrf):
                await _deny(send, "missing or wrong CSRF token")
                return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = list(HEADERS)
                if scope.get("path", "").startswith("/api/"):
                    extra.append((b"cache-control", b"no-store"))
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, with_headers)


def malformed(scope: Scope, method: str, headers: dict[str, str]) -> tuple[int, str, list[Header]] | None:
    """Why the request is not one of the dashboard's (status, one line, headers), or None when it may be."""
    raw = scope.get("raw_path") or str(scope.get("path", "")).encode("utf-8", "replace")
    query = scope.get("query_string", b"")
    if len(raw) > MAX_PATH or len(query) > MAX_QUERY:
        return 414, "the address is too long", []
    if not _plain(str(scope.get("path", ""))) or not _plain(raw.decode("latin-1")):
        return 400, "the path is not one of this dashboard's (printable ASCII only)", []
    if method not in METHODS:
        return 405, f"method {_shown(method)} is not allowed", [(b"allow", b"GET, HEAD, POST")]
    try:
        parse_qsl(query.decode("latin-1"), max_num_fields=MAX_QUERY_FIELDS)
    except ValueError:
        return 400, "too many query parameters", []
    length = headers.get("content-length")
    if length is not None:
        if not (length.isascii() and length.isdigit()):
            return 400, "the Content-Length is not a number", []
        if int(length) > MAX_BODY:
            return 413, f"the request body is over {MAX_BODY} bytes", []
    return None


def _plain(path: str) -> bool:
    """Printable ASCII without space: every path the dashboard serves, and nothing a terminal or log misreads."""
    return all("!" <= c <= "~" for c in path)


def _shown(text: str) -> str:
    return repr(text[:40]) if _plain(text) else "(not printable)"


def _same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        k, sep, v = part.strip().partition("=")
        if sep and k == name:
            return v
    return None


async def _deny(send: Send, why: str) -> None:
    await _answer(send, 403, why)


async def _answer(send: Send, status: int, why: str, extra: list[Header] | None = None) -> None:
    """A plain-text refusal: ``STATUS reason: why`` (the client may not have sent all of its body yet)."""
    body = f"{status} {_REASONS.get(status, 'refused')}: {why}\n".encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()), *(extra or []), *HEADERS]})
    await send({"type": "http.response.body", "body": body})


_REASONS = {400: "bad request", 403: "forbidden", 405: "method not allowed", 413: "payload too large",
            414: "URI too long"}


async def _redirect(send: Send, location: str, cookie: str) -> None:
    await send({"type": "http.response.start", "status": 303,
                "headers": [(b"location", location.encode("latin-1")), (b"set-cookie", cookie.encode("latin-1")),
                            (b"content-length", b"0"), *HEADERS]})
    await send({"type": "http.response.body", "body": b""})

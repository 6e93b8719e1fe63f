"""The dashboard's routes: the page, its static files, two event streams and four actions.

::

    GET  /                              the page (static/index.html; the views are #runs, #run/NAME, #nodes)
    GET  /static/...                    its script, style and the vendored uPlot
    GET  /api/session                   {"project", "csrf", "backend", "where", "states"}: what the page needs
    GET  /api/events                    SSE: "runs" (every run, RunStatus + queue places) and "nodes"
    GET  /api/runs/{run}/events         SSE: the run's "lines" (node, rank, text) and "points" (StepMetrics)
    GET  /api/experiments/{exp}/form    the typed form of the experiment (?run=NAME: filled from that run)
    POST /api/runs/{run}/kill           kill the run on every node (a Slurm run: scancel)
    POST /api/runs/{run}/stacks         every rank's stack now (a stalled run: the saved ones) + the diagnosis
    POST /api/runs/{run}/profile        its next 3 steps profiled on every rank (higgsfield profile), the shares
    GET  /api/runs/{run}/profiles/{stamp}/merged.trace.json   that profile's merged timeline (Perfetto opens it)
    POST /api/runs                      {"experiment", "values": {...}, "check": bool}: validate (and start) a run

Every request passes :class:`~higgsfield.control.ui.security.Guard` first (token cookie, CSRF
header on POST, Host, and the request's own shape). A user's mistake (a bad param, an
unknown run) answers 400 with ``{"error": one line}``, the line ``higgsfield run``
would print. A body that is not JSON (415 for another content type, 413 over
``MAX_BODY``, 400 when nested deeper than ``MAX_DEPTH``) never reaches the hub.

Live data goes by Server-Sent Events (one long GET each, reconnected by the browser
on its own); nothing is polled. One client address holds at most
``MAX_STREAMS_PER_CLIENT`` streams at once (a browser opens two a page, and keeps at
most six connections to one server anyway); one more is answered 429, and a stream's
place is given back however it ends, even before its first byte.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any, ClassVar

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from higgsfield.contract.codec import DecodeError, decode, rule
from higgsfield.contract.errors import HiggsfieldError
from higgsfield.contract.names import is_run_name
from higgsfield.contract.states import STATES
from higgsfield.contract.text import one_line, shown
from higgsfield.control.ui.hub import Hub
from higgsfield.control.ui.runfeed import Event
from higgsfield.control.ui.security import MAX_BODY, csrf_token

KEEPALIVE_S = 15.0   # an SSE comment this often keeps proxies and the browser from closing a quiet stream
STATIC = files("higgsfield.control.ui") / "static"
# Streams are asyncio tasks with a queue each (no thread), so the bound is about one address holding the
# server, not cost: a team's tabs through one SSH tunnel all arrive from 127.0.0.1, and 8 kept 42 of 50 out.
MAX_STREAMS_PER_CLIENT = 64
RETRY_MS = 1000     # the browser reconnects a dropped stream after this long
_STAMP = re.compile(r"\d{8}-\d{6}")   # a profile's folder under ./profiles/<run>/
MAX_DEPTH = 32       # a form is {"experiment", "values": {name: scalar}, "check"}: depth 2


def _sse(event: Event) -> ServerSentEvent:
    name, data = event
    return ServerSentEvent(json.dumps(data, separators=(",", ":"), allow_nan=False), event=name, sep="\n")


async def _stream(q: asyncio.Queue[Event], backlog: list[Event]) -> AsyncIterator[ServerSentEvent]:
    yield ServerSentEvent(retry=RETRY_MS, sep="\n")
    for ev in backlog:
        yield _sse(ev)
    while True:
        ev = await q.get()
        if ev[0] == "bye":
            return
        yield _sse(ev)
        if ev[0] == "reset":          # the page fell behind: it reconnects and gets the backlog again
            return


@dataclass(frozen=True)
class _Posted:
    """The body of ``POST /api/runs`` as it came (:func:`~higgsfield.contract.codec.decode`): ``values`` left
    out reads as none, but ``null`` stays None (no form); ``check`` is any JSON value, true when truthy."""

    WHAT: ClassVar[str] = "start form"

    experiment: str
    values: dict[str, Any] | None = field(default_factory=dict)
    check: bool = field(default=False, metadata=rule(decode=bool))


@dataclass(frozen=True)
class StartForm:
    """The body of ``POST /api/runs``, decoded once: the experiment, its form's values (its params, not yet
    checked: the hub checks them as ``higgsfield run`` would), and whether only to check them."""

    EXPECTED: ClassVar[str] = 'expected {"experiment": NAME, "values": {...}}'

    experiment: str
    values: dict[str, Any]
    check: bool = False

    @classmethod
    def parse(cls, body: object) -> StartForm | None:
        """The form in ``body`` (parsed JSON); None when it is not one (answered 400 with ``EXPECTED``).
        ``values`` may be left out (none); ``check`` is any JSON value, true when truthy."""
        try:
            posted = decode(_Posted, body)
        except DecodeError:
            return None
        if posted.values is None:
            return None
        return cls(posted.experiment, posted.values, posted.check)


def _error(e: Exception | str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": one_line(str(e))}, status_code=status)


class BadBody(ValueError):
    """A request body the dashboard does not take; ``status`` is its 4xx."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


async def read_json(request: Request, limit: int = MAX_BODY) -> Any:
    """The request's JSON body, read at most ``limit`` bytes far and parsed at most ``MAX_DEPTH`` deep."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise BadBody(415, "the request body must be application/json")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise BadBody(413, f"the request body is over {limit} bytes")
    except ClientDisconnect:
        raise BadBody(400, "the request body was cut off") from None
    try:
        data = json.loads(bytes(body))
    except RecursionError:
        raise BadBody(400, "the request is nested too deeply") from None
    except ValueError:
        raise BadBody(400, "the request is not JSON") from None
    if _depth(data) > MAX_DEPTH:
        raise BadBody(400, "the request is nested too deeply")
    return data


def _depth(value: Any) -> int:
    """How deeply ``value`` nests (iteratively: a deep value must not exhaust the stack here either)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            break
        if isinstance(v, dict):
            todo += [(x, d + 1) for x in v.values()]
        elif isinstance(v, list):
            todo += [(x, d + 1) for x in v]
    return deepest


class StreamSlots:
    """How many event streams each client address holds open, so one client cannot hold them all."""

    def __init__(self, per_client: int = MAX_STREAMS_PER_CLIENT) -> None:
        self.per_client = per_client
        self.open: Counter[str] = Counter()

    def take(self, client: str) -> bool:
        if self.open[client] >= self.per_client:
            return False
        self.open[client] += 1
        return True

    def give(self, client: str) -> None:
        self.open[client] -= 1
        if self.open[client] <= 0:
            del self.open[client]


class EventStream(EventSourceResponse):
    """An SSE response (framing, keep-alive comments, the client's disconnect: sse-starlette's) that runs
    ``release`` once when it ends, however: done, failed, cancelled, or the client gone before the first
    byte (when the body's own ``finally`` never runs)."""

    def __init__(self, content: AsyncIterator[ServerSentEvent], release: Callable[[], None]) -> None:
        super().__init__(content, sep="\n", ping=KEEPALIVE_S, ping_message_factory=_keepalive)
        self._release: Callable[[], None] | None = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


def _keepalive() -> ServerSentEvent:
    return ServerSentEvent(comment="keepalive", sep="\n")


def _path(request: Request, *names: str) -> list[str]:
    """The route's path parameters ``names`` (strings: starlette's default convertor), in that order."""
    return [str(request.path_params[n]) for n in names]


def create_app(hub: Hub, token: str) -> Starlette:
    """The ASGI app of ``hub`` (wrap it in :class:`~higgsfield.control.ui.security.Guard` to serve it)."""
    csrf = csrf_token(token)

    async def index(request: Request) -> Response:
        return FileResponse(str(STATIC / "index.html"), headers={"cache-control": "no-store"})

    async def session(request: Request) -> Response:
        return JSONResponse({"project": hub.cfg.name, "csrf": csrf, "backend": hub.backend.name,
                             "where": hub.fleet.label, "states": list(STATES)})   # the state filter's options

    slots = StreamSlots()

    def client(request: Request) -> str:
        return request.client.host if request.client else "-"

    def too_many() -> Response:
        return JSONResponse({"error": f"too many open event streams from this address (at most "
                                      f"{slots.per_client}): close a tab of the dashboard"},
                            status_code=429, headers={"retry-after": "5"})

    def sse(who: str, q: Any, backlog: Any, unsubscribe: Callable[[Any], None]) -> Response:
        """An event stream of ``backlog`` then ``q``; the subscription and ``who``'s slot end with it."""

        def release() -> None:
            unsubscribe(q)
            slots.give(who)

        return EventStream(_stream(q, backlog), release)

    async def events(request: Request) -> Response:
        who = client(request)
        if not slots.take(who):
            return too_many()
        q, backlog = hub.subscribe()
        return sse(who, q, backlog, hub.unsubscribe)

    async def run_events(request: Request) -> Response:
        run = request.path_params["run"]
        if not is_run_name(run):
            return _error(f"no run named {shown(run)} (see 'higgsfield status')", 404)
        who = client(request)
        if not slots.take(who):
            return too_many()
        try:
            feed = await hub.wait_for_run(run)
            q, backlog = feed.subscribe()
        except HiggsfieldError as e:
            slots.give(who)
            return _error(e, 404)
        except BaseException:
            slots.give(who)
            raise
        return sse(who, q, backlog, feed.unsubscribe)

    async def form(request: Request) -> Response:
        run = request.query_params.get("run")
        if run is not None and not is_run_name(run):
            return _error(f"?run={shown(run)} is not a run name", 400)
        try:
            return JSONResponse(hub.form(request.path_params["experiment"], run))
        except HiggsfieldError as e:
            return _error(e, 404)

    async def kill(request: Request) -> Response:
        try:
            return JSONResponse({"killed": await hub.kill(request.path_params["run"])})
        except HiggsfieldError as e:
            return _error(e)

    async def stacks(request: Request) -> Response:
        run = request.path_params["run"]
        if not is_run_name(run):
            return _error(f"no run named {shown(run)} (see 'higgsfield status')", 404)
        try:
            return JSONResponse(await hub.stacks(run))
        except HiggsfieldError as e:
            return _error(e)

    async def profile(request: Request) -> Response:
        (run,) = _path(request, "run")
        if not is_run_name(run):
            return _error(f"no run named {shown(run)} (see 'higgsfield status')", 404)
        try:
            return JSONResponse(await hub.profile(run))
        except HiggsfieldError as e:
            return _error(e)

    async def profile_trace(request: Request) -> Response:
        run, stamp = _path(request, "run", "stamp")
        path = hub.cfg.project_dir / "profiles" / run / stamp / "merged.trace.json"
        if not is_run_name(run) or not _STAMP.fullmatch(stamp) or not path.is_file():
            return _error("no such profile", 404)
        return FileResponse(path, media_type="application/json", filename=f"{run}-{stamp}.trace.json")

    async def start(request: Request) -> Response:
        try:
            body: Any = await read_json(request)
        except BadBody as e:
            return _error(e, e.status)
        form = StartForm.parse(body)
        if form is None:
            return JSONResponse({"error": StartForm.EXPECTED}, status_code=400)
        try:
            if form.check:
                return JSONResponse(hub.check(form.experiment, form.values))
            return JSONResponse(await hub.start_run(form.experiment, form.values))
        except HiggsfieldError as e:
            return _error(e)

    routes = [
        Route("/", index),
        Route("/api/session", session),
        Route("/api/events", events),
        Route("/api/runs/{run}/events", run_events),
        Route("/api/experiments/{experiment}/form", form),
        Route("/api/runs/{run}/kill", kill, methods=["POST"]),
        Route("/api/runs/{run}/stacks", stacks, methods=["POST"]),
        Route("/api/runs/{run}/profile", profile, methods=["POST"]),
        Route("/api/runs/{run}/profiles/{stamp}/merged.trace.json", profile_trace),
        Route("/api/runs", start, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=str(STATIC)), name="static"),
    ]
    return Starlette(routes=routes)

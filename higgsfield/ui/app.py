"""The dashboard's routes: the page, its static files, two event streams and three actions.

::

    GET  /                              the page (static/index.html; the views are #runs, #run/NAME, #nodes)
    GET  /static/...                    its script, style and the vendored uPlot
    GET  /api/session                   {"project", "csrf", "backend", "where"}: what the page needs
    GET  /api/events                    SSE: "runs" (every run, RunStatus + queue places) and "nodes"
    GET  /api/runs/{run}/events         SSE: the run's "lines" (node, rank, text) and "points" (StepMetrics)
    GET  /api/experiments/{exp}/form    the typed form of the experiment (?run=NAME: filled from that run)
    POST /api/runs/{run}/kill           kill the run on every node (a Slurm run: scancel)
    POST /api/runs                      {"experiment", "values": {...}, "check": bool}: validate (and start) a run

Every request passes :class:`~higgsfield.ui.security.Guard` first (token cookie, CSRF
header on POST, Host). A user's mistake (a bad param, an unknown run) answers 400
with ``{"error": one line}``, the line ``higgsfield run`` would print.

Live data goes by Server-Sent Events (one long GET each, reconnected by the browser
on its own); nothing is polled.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from importlib.resources import files
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from higgsfield.errors import HiggsfieldError
from higgsfield.text import one_line
from higgsfield.ui.hub import Hub
from higgsfield.ui.runfeed import Event
from higgsfield.ui.security import csrf_token

KEEPALIVE_S = 15.0   # an SSE comment this often keeps proxies and the browser from closing a quiet stream
STATIC = files("higgsfield.ui") / "static"


def _sse(event: Event) -> bytes:
    name, data = event
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'), allow_nan=False)}\n\n".encode()


async def _stream(q: asyncio.Queue[Event], backlog: list[Event]) -> AsyncIterator[bytes]:
    yield b"retry: 1000\n\n"
    for ev in backlog:
        yield _sse(ev)
    while True:
        try:
            ev = await asyncio.wait_for(q.get(), KEEPALIVE_S)
        except asyncio.TimeoutError:
            yield b": keepalive\n\n"
            continue
        if ev[0] == "bye":
            return
        if ev[0] == "reset":          # the page fell behind: it reconnects and gets the backlog again
            yield _sse(ev)
            return
        yield _sse(ev)


def _error(e: Exception, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": one_line(str(e))}, status_code=status)


def create_app(hub: Hub, token: str) -> Starlette:
    """The ASGI app of ``hub`` (wrap it in :class:`~higgsfield.ui.security.Guard` to serve it)."""
    csrf = csrf_token(token)
    sse_headers = {"cache-control": "no-store", "x-accel-buffering": "no"}

    async def index(request: Request) -> Response:
        return FileResponse(str(STATIC / "index.html"), headers={"cache-control": "no-store"})

    async def session(request: Request) -> Response:
        return JSONResponse({"project": hub.cfg.name, "csrf": csrf, "backend": hub.backend.name,
                             "where": hub.fleet.label})

    def sse(q: Any, backlog: Any, unsubscribe: Callable[[Any], None]) -> Response:
        """An event stream of ``backlog`` then ``q``; the subscription ends with the connection."""

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in _stream(q, backlog):
                    yield chunk
            finally:
                unsubscribe(q)

        return StreamingResponse(body(), media_type="text/event-stream", headers=sse_headers)

    async def events(request: Request) -> Response:
        q, backlog = hub.subscribe()
        return sse(q, backlog, hub.unsubscribe)

    async def run_events(request: Request) -> Response:
        try:
            feed = await hub.wait_for_run(request.path_params["run"])
        except HiggsfieldError as e:
            return _error(e, 404)
        q, backlog = feed.subscribe()
        return sse(q, backlog, feed.unsubscribe)

    async def form(request: Request) -> Response:
        try:
            return JSONResponse(hub.form(request.path_params["experiment"], request.query_params.get("run")))
        except HiggsfieldError as e:
            return _error(e, 404)

    async def kill(request: Request) -> Response:
        try:
            return JSONResponse({"killed": await hub.kill(request.path_params["run"])})
        except HiggsfieldError as e:
            return _error(e)

    async def start(request: Request) -> Response:
        try:
            body: Any = await request.json()
        except ValueError:
            return JSONResponse({"error": "the request is not JSON"}, status_code=400)
        if not isinstance(body, dict) or not isinstance(body.get("experiment"), str) \
                or not isinstance(body.get("values", {}), dict):
            return JSONResponse({"error": "expected {\"experiment\": NAME, \"values\": {...}}"}, status_code=400)
        try:
            if body.get("check"):
                return JSONResponse(hub.check(body["experiment"], body.get("values", {})))
            return JSONResponse(await hub.start_run(body["experiment"], body.get("values", {})))
        except HiggsfieldError as e:
            return _error(e)

    routes = [
        Route("/", index),
        Route("/api/session", session),
        Route("/api/events", events),
        Route("/api/runs/{run}/events", run_events),
        Route("/api/experiments/{experiment}/form", form),
        Route("/api/runs/{run}/kill", kill, methods=["POST"]),
        Route("/api/runs", start, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=str(STATIC)), name="static"),
    ]
    return Starlette(routes=routes)

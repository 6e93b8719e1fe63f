"""``higgsfield invoker data ...``: the node side of ``higgsfield data push``, ``doctor`` and ``prune``.

    status | missing | put | commit | serve | fetch | ingest | prune

Requests come as JSON on stdin (a token or a credential never on a command line), objects as
:class:`~higgsfield.contract.data.ObjectHeader` lines followed by their bytes; every reply is one
line of JSON, a type of :mod:`higgsfield.contract.data`.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TypeVar

import click

from higgsfield.contract import codec
from higgsfield.contract.data import DataError
from higgsfield.contract.decode import DecodeError, loads
from higgsfield.node.state.home import NodeState

T = TypeVar("T")


def _store(ctx: click.Context, project: str) -> Any:
    from higgsfield.contract.names import check_identifier
    from higgsfield.node.data.store import Store

    home = ctx.find_object(NodeState)
    assert home is not None, "the invoker group builds it"
    try:
        check_identifier(project, "project")
    except ValueError as e:
        raise DataError(str(e)) from None
    return Store(home, project)


def _emit(reply: object) -> None:
    sys.stdout.write(json.dumps(codec.encode(reply), sort_keys=True) + "\n")
    sys.stdout.flush()


def _request(cls: type[T], *, line: bool = False) -> T:
    """The request on stdin: all of it, or (``line``) its first line, stdin left open after it."""
    try:
        return codec.decode(cls, loads(sys.stdin.buffer.readline() if line else sys.stdin.buffer.read()))
    except DecodeError as e:
        raise DataError(f"the request on stdin does not decode: {e}") from None


@click.group(hidden=True)
def data() -> None:
    """Data entries on this node (``higgsfield data push``)."""


_project = click.option("--project", required=True)


@data.command()
@_project
@click.pass_context
@click.option("--missing", "ask", is_flag=True, help="stdin: MissingRequest; the reply names those this node lacks.")
def status(ctx: click.Context, project: str, ask: bool) -> None:
    """Each entry's current version and kept versions, and the free bytes (and, asked, the objects missing
    here: one command per node where a push made two)."""
    from dataclasses import replace

    from higgsfield.contract.data import MissingRequest

    store = _store(ctx, project)
    reply = store.status()
    _emit(replace(reply, missing=store.missing(_request(MissingRequest).shas)) if ask else reply)


@data.command()
@_project
@click.pass_context
def missing(ctx: click.Context, project: str) -> None:
    """stdin: MissingRequest. The objects this node lacks."""
    from higgsfield.contract.data import MissingReply, MissingRequest

    _emit(MissingReply(missing=_store(ctx, project).missing(_request(MissingRequest).shas)))


@data.command()
@_project
@click.pass_context
def put(ctx: click.Context, project: str) -> None:
    """stdin: objects (header line + bytes). Each is verified and stored."""
    _emit(_store(ctx, project).receive(sys.stdin.buffer))


@data.command()
@_project
@click.pass_context
def commit(ctx: click.Context, project: str) -> None:
    """stdin: CommitRequest. Build the version (if new) and make it current, atomically."""
    from higgsfield.contract.data import CommitRequest

    _emit(_store(ctx, project).commit(_request(CommitRequest)))


@data.command()
@_project
@click.pass_context
def serve(ctx: click.Context, project: str) -> None:
    """stdin: ServeRequest. Print the port, serve the authenticated peers, then what was sent."""
    from higgsfield.contract.data import PutReply, ServeRequest
    from higgsfield.node.data.peer import serve as _serve

    store = _store(ctx, project)
    req = _request(ServeRequest, line=True)
    sent = _serve(store, req, ready=_emit, stopped=_stdin_closed)
    _emit(PutReply(stored=sent))


def _stdin_closed(seconds: float) -> bool:
    """Whether stdin ended within ``seconds``: the push that keeps this command's stdin open is gone."""
    import os
    import select

    fd = sys.stdin.buffer.fileno()
    readable, _, _ = select.select([fd], [], [], seconds)
    return bool(readable) and not os.read(fd, 4096)


@data.command()
@_project
@click.pass_context
def fetch(ctx: click.Context, project: str) -> None:
    """stdin: FetchRequest. Take the objects from the serving peer."""
    from higgsfield.contract.data import FetchRequest
    from higgsfield.node.data.peer import fetch as _fetch

    store = _store(ctx, project)
    req = _request(FetchRequest)
    got = _fetch(store, req, progress=_emit)
    for c in req.commits:   # the objects are all here now: make the versions current
        store.commit(c)
    _emit(got)


@data.command()
@_project
@click.option("--name", required=True)
@click.pass_context
def ingest(ctx: click.Context, project: str, name: str) -> None:
    """stdin: IngestRequest. Download a URL or Hub source here, store it, make it current."""
    from higgsfield.contract.data import IngestRequest
    from higgsfield.node.data.sources import ingest as _ingest

    _emit(_ingest(_store(ctx, project), name, _request(IngestRequest)))


@data.command()
@_project
@click.option("--dry-run", is_flag=True)
@click.pass_context
def prune(ctx: click.Context, project: str, dry_run: bool) -> None:
    """Remove versions that are not current, and objects no version uses."""
    _emit(_store(ctx, project).prune(dry_run=dry_run))

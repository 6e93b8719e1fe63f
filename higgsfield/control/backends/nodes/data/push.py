"""``higgsfield data push``: every ``data:`` entry onto every node, each byte over the laptop's uplink once.

1. Each laptop-path entry's manifest (:mod:`.manifest`; sha256s cached by stat). A URL or Hub
   entry is downloaded by node 0 alone (``invoker data ingest``), which answers its manifest.
2. Every node, at once: which entries are current there, which objects it lacks, its free
   space. A node short of space refuses the push before a byte is sent (one line naming it).
3. The laptop sends node 0 the objects it lacks, in batches (``invoker data put``), each file
   read again and checked against the manifest (a file that changed stops the push).
4. Meanwhile the other nodes copy along a chain, each from the one before it, whatever that one
   holds already (:mod:`.fanout`: ``invoker data serve`` / ``fetch``, a fresh token on SSH stdin,
   the gang wire's handshake), so the uplink carries each byte once and the LAN the rest.
5. Every node makes each entry's new version current (``invoker data commit``): staged, renamed,
   the link swapped; a run sees the old version or the whole new one.

An unchanged entry sends nothing; a changed one only its changed files (objects are content
addressed); a cut push resumes from the objects already stored.

Use::

    result = push(cfg, ["corpus"], on_progress=print)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from higgsfield.contract import layout
from higgsfield.contract.codec import encode
from higgsfield.contract.data import (
    CommitReply,
    CommitRequest,
    DataError,
    DataFile,
    DataStatusReply,
    IngestReply,
    IngestRequest,
    Manifest,
    MissingRequest,
    PushedEntry,
    PushedNode,
    PushReport,
    PutReply,
)
from higgsfield.contract.errors import CommandError
from higgsfield.contract.units import human_bytes
from higgsfield.control.backends.nodes.data.fanout import NodeProgress, follow_chain
from higgsfield.control.backends.nodes.data.manifest import read_checked, scan
from higgsfield.control.backends.nodes.output import invoke_reply
from higgsfield.control.config import Config
from higgsfield.control.remote import Group, Member, open_group
from higgsfield.control.remote.invoker import node_state_dir

BATCH_BYTES = 64 << 20     # one ``put`` command's objects (a file larger than this goes alone)
PUT_CONCURRENCY = 2        # puts in flight to node 0: the link stays busy while the next one starts up
SLACK = 64 << 20           # free space kept beyond what a push needs


@dataclass
class Entry:
    """One entry of this push: its name, where it comes from, its manifest once known."""

    name: str
    source: str
    kind: str
    root: Path | None = None
    manifest: Manifest | None = None
    dest: str = ""

    @property
    def version(self) -> str:
        assert self.manifest is not None
        return self.manifest.version()


@dataclass
class PushResult:
    """What a push did: each entry's version, each node's bytes, the bytes over the uplink."""

    entries: list[PushedEntry] = field(default_factory=list)
    nodes: list[NodeProgress] = field(default_factory=list)
    uplink_bytes: int = 0
    seconds: float = 0.0


def report(result: PushResult) -> PushReport:
    """The push as ``--json`` prints it."""
    return PushReport(entries=result.entries, uplink_bytes=result.uplink_bytes, seconds=round(result.seconds, 3),
                      nodes=[PushedNode(node=n.node, state=n.state, bytes=n.done, via=n.via, rate=round(n.rate, 1))
                             for n in result.nodes])


def select(cfg: Config, names: Sequence[str]) -> list[Entry]:
    """The entries ``names`` asks for (default: all); DataError naming an unknown one."""
    if not cfg.data:
        raise DataError(f"{cfg.path or 'higgsfield.yml'}: no data: entries to push; add one (data: {{corpus: "
                        "./data}})")
    for n in names:
        if n not in cfg.data:
            raise DataError(f"no data entry named '{n}' in {cfg.path or 'higgsfield.yml'} "
                            f"(entries: {', '.join(cfg.data)})")
    out = []
    for name in names or list(cfg.data):
        e = cfg.data[name]
        root = None
        if e.kind == "path":
            root = Path(e.source).expanduser()
            root = root if root.is_absolute() else cfg.project_dir / root
        out.append(Entry(name=name, source=e.shown_source(), kind=e.kind, root=root, dest=e.dest or ""))
    return out


def laptop_manifests(cfg: Config, entries: list[Entry]) -> None:
    cache = cfg.project_dir / ".higgsfield" / "data-cache"
    for e in entries:
        if e.root is not None:
            e.manifest = scan(e.root, cache=cache / f"{e.name}.json", name=e.name)


async def all_current(cfg: Config, group: Group, entries: list[Entry]) -> bool:
    """Whether every node's ``current`` link of every entry resolves to that entry's version already.

    One plain ``readlink -e`` per node (milliseconds) instead of an invoker's start-up (a Python
    process that imports higgsfield: half a second to seconds on a loaded node): a version
    directory is renamed into place whole before the link is swapped to it, so a link that resolves
    to it means the node holds all of it. Any doubt (an entry without a laptop manifest, a node
    that answers otherwise) is False, and the push asks each node's invoker as before.
    """
    if not entries or any(e.manifest is None for e in entries):
        return False
    base = f"{node_state_dir(cfg)}/{layout.data_dir(cfg.name)}/entries"
    links = [(f"{base}/{e.name}/current", e.version) for e in entries]
    links += [(f"{node_state_dir(cfg)}/{e.dest.rstrip('/')}", e.version) for e in entries if e.dest]
    argv = ["readlink", "-e", "--", *(path for path, _ in links)]

    async def one(m: Member) -> bool:
        r = await m.transport.run(argv, check=False)
        got = r.stdout.splitlines()
        return r.ok and len(got) == len(links) and all(
            PurePosixPath(g).name == version for g, (_, version) in zip(got, links, strict=True))

    return all(r.ok and r.value for r in await group.run(one))


async def node_status(cfg: Config, group: Group, shas: list[str] | None = None) -> dict[str, DataStatusReply]:
    """Every node's entries and free space; with ``shas``, also which of them it lacks (the same command)."""
    ask = ["--missing"] if shas is not None else []
    data = json.dumps(encode(MissingRequest(shas=shas))) if shas is not None else None

    async def one(m: Member) -> DataStatusReply:
        return await invoke_reply(m.transport, cfg, ["data", "status", "--project", cfg.name, *ask], DataStatusReply,
                                  input=data)

    results = Group.check(await group.run(one), "data status")
    return {r.node: r.value for r in results if r.value is not None}


async def push_async(cfg: Config, names: Sequence[str] = (), *, secrets: dict[str, str] | None = None,
                     on_progress: Callable[[list[NodeProgress]], None] | None = None) -> PushResult:
    t0 = time.monotonic()
    entries = select(cfg, names)
    laptop_manifests(cfg, entries)
    result = PushResult(nodes=[NodeProgress(node=str(n.name)) for n in cfg.nodes])
    prog = {p.node: p for p in result.nodes}

    def tick() -> None:
        if on_progress is not None:
            on_progress(result.nodes)

    async with open_group(cfg) as group:
        first = group.members[0]
        for e in entries:   # a URL or Hub source: node 0 downloads it (the others copy from the nodes)
            if e.kind != "path":
                prog[first.name].state = f"downloading {e.name}"
                tick()
                try:
                    got = await invoke_reply(first.transport, cfg, ["data", "ingest", "--project", cfg.name,
                                                                    "--name", e.name],
                                             IngestReply, input=json.dumps(encode(IngestRequest(
                                                 source=cfg.data[e.name].source, revision=cfg.data[e.name].revision
                                                 or "", secrets=dict(secrets or {}), dest=e.dest))),
                                             timeout=max(cfg.ssh.command_timeout, 3600))
                except CommandError as err:   # a revision or path the source lacks: the node's one line
                    raise refusal(first.name, err) from None
                e.manifest = got.manifest
        if await all_current(cfg, group, entries):   # the common re-push: one readlink per node, no invoker
            for p in result.nodes:
                p.state = "up to date"
            tick()
            result.entries = [_pushed(e) for e in entries]
            result.seconds = time.monotonic() - t0
            return result
        objects: dict[str, tuple[Entry, DataFile]] = {}
        for e in entries:
            assert e.manifest is not None
            for f in e.manifest.files:
                objects.setdefault(f.sha256, (e, f))
        # one command per node: its entries, its free space, and which objects it lacks (a node holds every
        # object of an entry current there, so asking for all of them asks for those of the entries it needs)
        status = await node_status(cfg, group, list(objects))
        wanted: dict[str, list[Entry]] = {}      # node -> entries not current there
        for m in group.members:
            st = status[m.name]
            wanted[m.name] = [e for e in entries   # a dest is linked again (cheap: the version is there)
                              if (x := st.entry(e.name)) is None or x.current != e.version or e.dest]
        missing = {m.name: list(status[m.name].missing) for m in group.members}
        for m in group.members:
            need = sum(objects[s][1].size for s in missing[m.name])
            p = prog[m.name]
            p.total = need
            p.state = "up to date" if not wanted[m.name] else ("waiting" if need else "committing")
            free = status[m.name].free_bytes
            if need and need + SLACK > free:
                raise DataError(f"{m.name}: {human_bytes(need)} to receive but {human_bytes(free)} free in its "
                                "state directory: free space there (higgsfield prune) and push again")
        tick()

        async def upload() -> None:
            result.uplink_bytes = await _send_to_first(cfg, first, [objects[s] for s in missing[first.name]],
                                                       prog[first.name], tick)
            await _commit(cfg, first, wanted[first.name], prog[first.name], tick)

        # the other nodes copy along the chain while the laptop still sends to node 0
        await _together(upload(), follow_chain(
            cfg, group, missing, prog, tick,
            commit=lambda m: _commit(cfg, m, wanted[m.name], prog[m.name], tick),
            commits=lambda m: [_commit_request(e) for e in wanted[m.name]]))
    result.entries = [_pushed(e) for e in entries]
    result.seconds = time.monotonic() - t0
    return result


async def _send_to_first(cfg: Config, m: Member, items: list[tuple[Entry, DataFile]], p: NodeProgress,
                         tick: Callable[[], None]) -> int:
    """The objects node 0 lacks, from the laptop, in batches (a few in flight); bytes sent."""
    if not items:
        return 0
    batches: list[list[tuple[Entry, DataFile]]] = [[]]
    size = 0
    for it in items:
        if batches[-1] and size + it[1].size > BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(it)
        size += it[1].size
    p.state, p.via, p.started = "receiving", "laptop", time.monotonic()
    tick()
    gate = asyncio.Semaphore(PUT_CONCURRENCY)

    async def one(batch: list[tuple[Entry, DataFile]]) -> int:
        async with gate:
            parts = []
            for e, f in batch:
                assert e.root is not None
                data = read_checked(e.root, f, e.name)
                parts.append(json.dumps(encode(_header(f))).encode() + b"\n")
                parts.append(data)
            payload = b"".join(parts)
            await invoke_reply(m.transport, cfg, ["data", "put", "--project", cfg.name], PutReply, input=payload)
            sent = sum(f.size for _, f in batch)
            p.done += sent
            tick()
            return sent

    tasks = [asyncio.ensure_future(one(b)) for b in batches]
    try:
        sent = sum(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        raise
    return sent


async def _together(*coros: Awaitable[None]) -> None:
    """Run ``coros`` at once; the first failure cancels the others and is raised."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        for t in asyncio.as_completed(tasks):
            await t
    except BaseException:
        for t in tasks:
            t.cancel()
        raise


def _pushed(e: Entry) -> PushedEntry:
    return PushedEntry(name=e.name, version=e.version, source=e.source, files=len(_files(e)),
                       bytes=sum(f.size for f in _files(e)))


def _commit_request(e: Entry) -> CommitRequest:
    assert e.manifest is not None
    return CommitRequest(name=e.name, manifest=e.manifest, source=e.source, dest=e.dest)


def _files(e: Entry) -> list[DataFile]:
    assert e.manifest is not None
    return e.manifest.files


def _header(f: DataFile) -> object:
    from higgsfield.contract.data import ObjectHeader

    return ObjectHeader(sha256=f.sha256, size=f.size)


async def _commit(cfg: Config, m: Member, entries: list[Entry], p: NodeProgress, tick: Callable[[], None]) -> None:
    """Make each of ``entries`` current on ``m`` (its objects all there now)."""
    if not entries:
        p.state = "up to date"
        tick()
        return
    p.state = "committing"
    tick()
    for e in entries:
        assert e.manifest is not None
        try:
            await invoke_reply(m.transport, cfg, ["data", "commit", "--project", cfg.name], CommitReply,
                               input=json.dumps(encode(_commit_request(e))))
        except CommandError as err:
            raise refusal(m.name, err) from None
    p.state = "done"
    tick()


def refusal(node: str, err: CommandError) -> Exception:
    """A node's own one-line refusal (its invoker exited 2: a dest taken by a user's file) as the push's
    DataError naming the node (exit 2); any other failure as it was."""
    if err.exit_status != 2:
        return err
    line = (err.stderr.strip().splitlines() or [str(err)])[-1].removeprefix("error: ")
    return DataError(f"{node}: {line}")


def push(cfg: Config, names: Sequence[str] = (), *, secrets: dict[str, str] | None = None,
         on_progress: Callable[[list[NodeProgress]], None] | None = None) -> PushResult:
    """Push ``names`` (default: every entry) to every node (module doc); DataError / GroupError otherwise."""
    return asyncio.run(push_async(cfg, names, secrets=secrets, on_progress=on_progress))

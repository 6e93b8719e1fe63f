"""What the nodes hold of the ``data:`` entries: ``run`` refuses a node whose copy is stale, ``doctor`` lists them.

A laptop-path entry's version is its manifest's (hashes cached by stat, so this costs a ``stat``
per file); a URL or Hub entry has no version on the laptop, so the nodes must agree with node 0.

Use::

    await refuse_stale(cfg, group)          # DataError (exit 2), one line naming the node and the entry
    rows = await versions(cfg, group)       # [(node, entry, version or None)]
"""

from __future__ import annotations

from higgsfield.contract.data import DataError
from higgsfield.control.backends.nodes.data.push import all_current, laptop_manifests, node_status, select
from higgsfield.control.config import Config
from higgsfield.control.remote import Group


async def versions(cfg: Config, group: Group) -> list[tuple[str, str, str | None]]:
    """Every node's current version of every entry (None: it has none)."""
    status = await node_status(cfg, group)
    out = []
    for m in group.members:
        st = status[m.name]
        for name in cfg.data:
            e = st.entry(name)
            out.append((m.name, name, e.current if e else None))
    return out


async def refuse_stale(cfg: Config, group: Group) -> None:
    """DataError naming the first node whose copy of an entry is missing or not this project's version."""
    if not cfg.data:
        return
    entries = select(cfg, ())
    laptop_manifests(cfg, entries)
    if await all_current(cfg, group, entries):   # one readlink per node: the usual case, no invoker start-up
        return
    held = await versions(cfg, group)
    first = {name: v for node, name, v in held if node == group.members[0].name}
    for e in entries:
        want = e.version if e.manifest is not None else first.get(e.name)
        for node, name, have in held:
            if name != e.name:
                continue
            if have is None or have != want:
                what = "has no copy" if have is None else f"holds version {have}"
                wanted = f"this project's is {want}" if want else "node 0 has none"
                raise DataError(f"{node}: data '{name}' is stale there ({what}, {wanted}): run 'higgsfield data "
                                f"push {name}' (or deploy)")


async def _held(cfg: Config) -> list[tuple[str, str, str | None]]:
    from higgsfield.control.remote import open_group

    async with open_group(cfg) as group:
        return await versions(cfg, group)


def differing(cfg: Config, held: list[tuple[str, str, str | None]]) -> list[str]:
    """One line per node whose version of an entry is not this project's (a laptop path) or not the most nodes'."""
    from collections import Counter

    entries = {e.name: e for e in select(cfg, ())} if cfg.data else {}
    laptop_manifests(cfg, list(entries.values()))
    out = []
    for name, e in entries.items():
        rows = [(node, v) for node, n, v in held if n == name]
        common = Counter(v for _, v in rows if v).most_common(1)
        want = e.version if e.manifest is not None else (common[0][0] if common else None)
        for node, v in rows:
            if v != want:
                out.append(f"{node} differs: data '{name}' is {v or 'missing'} there, "
                           f"{'this project' if e.manifest is not None else 'the other nodes'} "
                           f"{'has' if e.manifest is not None else 'hold'} {want}")
    return out


def data_versions(cfg: Config) -> tuple[list[tuple[str, str, str | None]], list[str]]:
    """(node, entry, version) of every node and entry, and the lines naming the nodes that differ."""
    import asyncio

    held = asyncio.run(_held(cfg))
    return held, differing(cfg, held)

"""Notes from many nodes that differ only in each node's own names, as one line for all of them.

Shared by ``setup``'s summary and ``doctor``'s problems: 16 nodes' "added hfnodeN to the docker
group" read as one "added <user> to the docker group" naming the 16 nodes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

__all__ = ["merge_notes"]


def merge_notes(notes: Iterable[tuple[str, str, Mapping[str, str | None]]]) -> list[tuple[str, list[str]]]:
    """Notes (text, node, {placeholder: that node's name for it}) as one line each for the nodes whose notes
    differ only in those names (16 "added hfnodeN to the docker group" -> "added <user> to the docker
    group" for 16 nodes); a note alone keeps its names. In first-seen order."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for text, node, names in notes:
        template = text
        for placeholder, value in names.items():
            if value:
                template = re.sub(rf"(?<![\w.-]){re.escape(value)}(?![\w.-])", placeholder, template)
        groups.setdefault(template, []).append((text, node))
    merged = []
    for template, items in groups.items():
        texts = {t for t, _ in items}
        merged.append((texts.pop() if len(texts) == 1 else template, [n for _, n in items]))
    return merged

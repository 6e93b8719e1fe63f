"""Reading ``higgsfield.yml``: the file, its text, one YAML parse, then the schema.

Every problem on the way is one :class:`~higgsfield.contract.errors.ConfigError` line naming
the file and, where there is one, the line and the field::

    higgsfield.yml:7: nodes[1].port: must be between 1 and 65535 (got 70000)

The YAML is parsed once. The node tree PyYAML composes is checked (keys are names,
each once; an alias bomb is refused before anything expands it), indexed for line
numbers, and then constructed into plain data from that same tree.

Use::

    cfg = load_config()              # ./higgsfield.yml, or the nearest one above
    cfg.nodes[0].host, cfg.project_dir
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from higgsfield.contract.errors import ConfigError
from higgsfield.contract.text import shown
from higgsfield.control.config.diagnostics import describe
from higgsfield.control.config.schema import CONFIG_FILE, Config

__all__ = ["MAX_CONFIG_BYTES", "MAX_YAML_NODES", "YamlDocument", "decode_text", "find_config", "load_config",
           "parse_config", "parse_yaml", "read_config_text"]

#: A config is a few KB; anything this big is the wrong file (and would take PyYAML seconds).
MAX_CONFIG_BYTES = 256 * 1024
#: YAML nodes visited, aliases expanded, before a config is called an alias bomb.
MAX_YAML_NODES = 100_000

_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"


def find_config(start: Path | None = None) -> Path:
    """The nearest ``higgsfield.yml`` at or above ``start`` (default: the working directory)."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        candidate = d / CONFIG_FILE
        if candidate.is_file():
            return candidate
    raise ConfigError(f"no {CONFIG_FILE} in {here} or above: run 'higgsfield init NAME' to create a project, "
                      "or pass --config")


def load_config(path: Path | str | None = None) -> Config:
    """Read, validate and return the config; raises ConfigError with file:line: field: message."""
    p = Path(path) if path else find_config()
    return parse_config(read_config_text(p), p)


def read_config_text(p: Path) -> str:
    """The text of the config file: a regular file, at most MAX_CONFIG_BYTES, UTF-8, not binary."""
    try:
        if not p.is_file():
            # A FIFO or /dev/zero would block or never end; a directory cannot be read.
            raise ConfigError(f"{p}: file not found" if not p.exists() else f"{p}: not a regular file")
        with open(p, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{p}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: larger than {MAX_CONFIG_BYTES // 1024} KiB; a higgsfield.yml is a few KB, "
                          "is this the right file?")
    return decode_text(data, p, "YAML")


def decode_text(data: bytes, p: Path, kind: str) -> str:
    """``data`` as UTF-8 text (a BOM is dropped); ConfigError naming the line of a bad byte or a NUL."""
    if b"\x00" in data:
        line = data[:data.index(b"\x00")].count(b"\n") + 1
        raise ConfigError(f"{p}:{line}: a NUL byte: this is a binary file, not {kind} text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ConfigError(f"{p}:{line}: byte 0x{data[e.start]:02x} is not UTF-8: save the file as UTF-8 "
                          f"{kind} text") from None


def parse_config(text: str, path: Path) -> Config:
    """Validate the config ``text`` read from ``path``; every problem is one ConfigError line."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // 1024} KiB; a higgsfield.yml is a few KB")
    doc = parse_yaml(text, path)
    if doc.data is None:
        raise ConfigError(f"{path}: the file is empty; it needs at least 'name' and 'nodes'")
    if not isinstance(doc.data, dict):
        raise ConfigError(f"{path}:1: the top level must be a mapping of keys (name, nodes, ...)")
    try:
        cfg = Config.model_validate(doc.data)
    except ValidationError as e:
        raise ConfigError(describe(e, doc.line_of, path)) from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    cfg.path = path.resolve()
    return cfg


class YamlDocument:
    """One parsed YAML document: its plain data, and the line where each key or list item was written."""

    def __init__(self, data: Any, root: yaml.Node | None, children: dict[int, list[Any]]) -> None:
        self.data = data
        self._root = root
        # id(node) -> node.value as composed. PyYAML's constructor rewrites a mapping with merge keys
        # (<<) in place, so lines are looked up in this copy: they point at what the user wrote.
        self._children = children

    def line_of(self, loc: tuple[Any, ...]) -> int | None:
        """The 1-based line of the value at ``loc`` (keys and list indexes), or of its nearest existing parent."""
        node = self._root
        line = node.start_mark.line + 1 if node is not None else None
        for part in loc:
            nxt = None
            value = self._children.get(id(node), [])
            if isinstance(node, yaml.MappingNode) and isinstance(part, str):
                for k, v in value:
                    if k.value == part:
                        line = k.start_mark.line + 1
                        nxt = v
                        break
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(value):
                nxt = value[part]
                line = nxt.start_mark.line + 1
            if nxt is None:
                break
            node = nxt
        return line


def parse_yaml(text: str, path: Path) -> YamlDocument:
    """Parse ``text`` once: compose, check the keys, index the lines, construct; ConfigError on any problem."""
    try:
        loader = yaml.SafeLoader(text)   # reads the text: a ReaderError for a character YAML forbids
        try:
            root = loader.get_single_node()
            children = _check_keys(root, path)
            data = None if root is None else loader.construct_document(root)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f":{mark.line + 1}" if mark else ""
        what = e.problem or e.context
        if e.problem and e.context and e.problem.startswith("but "):  # "expected X ... but found Y"
            what = f"{e.context}, {e.problem}"
        raise ConfigError(f"{path}{line}: invalid YAML: {what}") from None
    except yaml.reader.ReaderError as e:
        at = text[:e.position].count("\n") + 1
        char = e.character if isinstance(e.character, str) else chr(e.character)
        raise ConfigError(f"{path}:{at}: invalid YAML: character U+{ord(char):04X} is not allowed in YAML "
                          "text") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid YAML: nested too deeply") from None
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - PyYAML's constructors on a tagged value: ValueError (an int of
        # 5000 digits, 2020-13-45), AttributeError ('!!timestamp x'), TypeError...: all mean "cannot be read".
        raise ConfigError(f"{path}: invalid YAML: a value cannot be read ({shown(str(e))})") from None
    return YamlDocument(data, root, children)


def _check_keys(root: yaml.Node | None, path: Path) -> dict[int, list[Any]]:
    """Keys are names, each once per mapping; an alias bomb is refused before anything expands it.

    The walk follows aliases as the loader will (that is where a bomb's cost is), but
    counts every node it visits and stops at MAX_YAML_NODES: a config is a few hundred.
    It returns each mapping's and sequence's children as composed, for line numbers.
    """
    children: dict[int, list[Any]] = {}
    stack: list[yaml.Node] = [root] if root is not None else []
    visited = 0
    while stack:
        node = stack.pop()
        visited += 1
        if visited > MAX_YAML_NODES:
            raise ConfigError(f"{path}:{node.start_mark.line + 1}: invalid YAML: anchors and aliases expand to more "
                              f"than {MAX_YAML_NODES} values; write the values out (an alias bomb?)")
        if isinstance(node, yaml.MappingNode):
            children[id(node)] = list(node.value)
            seen: set[Any] = set()
            values = []
            for k, v in node.value:
                if not isinstance(k, yaml.ScalarNode):
                    raise ConfigError(f"{path}:{k.start_mark.line + 1}: a key must be a name, not a list or mapping")
                if k.tag not in (_STR_TAG, _MERGE_TAG):
                    raise ConfigError(f"{path}:{k.start_mark.line + 1}: key {shown(k.value)} must be a name, "
                                      "not a number or bool")
                if k.value in seen:
                    raise ConfigError(f"{path}:{k.start_mark.line + 1}: key {shown(k.value)} appears twice")
                seen.add(k.value)
                values.append(v)
            stack.extend(reversed(values))   # in document order, so the first problem is the one reported
        elif isinstance(node, yaml.SequenceNode):
            children[id(node)] = list(node.value)
            stack.extend(reversed(node.value))
    return children

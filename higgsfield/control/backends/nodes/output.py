"""Calling a node's invoker and decoding what it prints: the verb's typed reply
(:mod:`higgsfield.contract.replies`, read by :func:`higgsfield.contract.codec.decode` once, here),
or one clear error naming the node.

Use::

    built = await invoke_reply(t, cfg, ["build", ...], BuildReply)     # a BuildReply; CommandError if not
    have = await invoke_reply_or_none(t, cfg, ["deployed", ...], Deployment)
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, TypeVar

from higgsfield.contract import codec
from higgsfield.contract.decode import DecodeError
from higgsfield.contract.errors import CommandError
from higgsfield.control.remote.invoker import invoker_argv

if TYPE_CHECKING:
    from higgsfield.control.config import Config
    from higgsfield.control.remote import Transport

UPGRADE_HINT = "run 'higgsfield setup' to upgrade the invoker"

R = TypeVar("R")


def decode(node: str, stdout: str, *, expect: type | None = None, keys: tuple[str, ...] = (),
           nullable: bool = False) -> Any:
    """``json.loads(stdout)``, checked to be an ``expect`` holding ``keys`` (or null, if ``nullable``).

    An invoker of another version (or a login script printing to stdout) shows up
    here: the error says what came back instead of a traceback.
    """
    try:
        data = json.loads(stdout)
    except ValueError:
        raise CommandError(node, f"unexpected invoker output: {_excerpt(stdout)} ({UPGRADE_HINT})",
                           stdout=stdout) from None
    if data is None and nullable:
        return None
    if expect is not None and not isinstance(data, expect):
        raise CommandError(node, f"unexpected invoker output: expected a JSON {expect.__name__}, got "
                           f"{_excerpt(stdout)} ({UPGRADE_HINT})", stdout=stdout)
    missing = [k for k in keys if not isinstance(data, dict) or k not in data]
    if missing:
        raise CommandError(node, f"unexpected invoker output: no {', '.join(missing)} in {_excerpt(stdout)} "
                           f"({UPGRADE_HINT})", stdout=stdout)
    return data


def _excerpt(text: str, limit: int = 200) -> str:
    text = text.strip()
    if not text:
        return "nothing"
    return repr(text if len(text) <= limit else text[:limit] + "...")


async def invoke(t: Transport, cfg: Config, args: list[str], *, input: bytes | str | None = None,
                 timeout: float | None = None, expect: type | None = dict, keys: tuple[str, ...] = (),
                 nullable: bool = False) -> Any:
    """Run ``higgsfield invoker ARGS`` on ``t``'s node; its JSON output, checked by :func:`decode`."""
    res = await t.run([*invoker_argv(cfg, cfg.node(t.node)), *args], input=input,
                      timeout=timeout or cfg.ssh.command_timeout)
    return decode(t.node, res.stdout, expect=expect, keys=keys, nullable=nullable)


def decode_reply(node: str, stdout: str, reply: type[R]) -> R:
    """``stdout`` (one JSON object) as ``reply``: a reply that does not decode, or of another version, is one
    line naming ``node`` and saying to run ``higgsfield setup``."""
    return as_reply(node, decode(node, stdout, expect=None), reply, stdout=stdout)


def as_reply(node: str, data: object, reply: type[R], *, stdout: str | None = None) -> R:
    """Parsed JSON as ``reply`` (:func:`decode_reply`'s error)."""
    try:
        return codec.decode(reply, data)
    except DecodeError as e:
        raise CommandError(node, f"unexpected invoker output: {e} ({UPGRADE_HINT})", stdout=stdout or "") from None


async def invoke_reply(t: Transport, cfg: Config, args: list[str], reply: type[R], *,
                       input: bytes | str | None = None, timeout: float | None = None) -> R:
    """Run ``higgsfield invoker ARGS`` on ``t``'s node; its reply, decoded once into ``reply``."""
    res = await t.run([*invoker_argv(cfg, cfg.node(t.node)), *args], input=input,
                      timeout=timeout or cfg.ssh.command_timeout)
    return decode_reply(t.node, res.stdout, reply)


async def invoke_reply_or_none(t: Transport, cfg: Config, args: list[str], reply: type[R], *,
                               input: bytes | str | None = None, timeout: float | None = None) -> R | None:
    """:func:`invoke_reply` for a verb that answers null when there is nothing (``deployed``)."""
    res = await t.run([*invoker_argv(cfg, cfg.node(t.node)), *args], input=input,
                      timeout=timeout or cfg.ssh.command_timeout)
    data = decode(t.node, res.stdout, expect=None, nullable=True)
    return None if data is None else as_reply(t.node, data, reply, stdout=res.stdout)

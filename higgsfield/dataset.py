"""Training examples as text segments that are trained on, or not.

Every dataset here is a sequence whose items are lists of :data:`Segment`
``(text, train)``: :class:`higgsfield.loaders.LlamaLoader` tokenizes each segment
and masks the labels of those with ``train=False`` (prompts, user turns,
system messages), so the model learns to answer, not to ask. ::

    from higgsfield.dataset import PromptCompletionDataset, ChatDataset, TextDataset, load_jsonl

    ds = PromptCompletionDataset([{"prompt": "2+2=", "completion": "4"}])
    ds[0]  # [("2+2=", False), ("4", True)]
    chat = ChatDataset(load_jsonl("chats.jsonl"))   # {"messages": [{"role": ..., "content": ...}]}

Sources: a list of dicts, a ``datasets.Dataset`` (anything indexable returning
dicts) or :func:`load_jsonl`. No torch and nothing downloaded here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["Segment", "Example", "SegmentDataset", "PromptCompletionDataset", "TextDataset", "MultiTurnDataset",
           "ChatDataset", "AlpacaDataset", "load_jsonl", "ALPACA_PROMPT", "ALPACA_PROMPT_NO_INPUT"]

Segment = tuple[str, bool]
Example = list[Segment]


def load_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """One JSON object per line (blank lines skipped); errors name the line."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not valid JSON: {e.msg}") from None
    return rows


class SegmentDataset:
    """Base: wraps indexable ``source`` rows and turns each into segments with :meth:`render`."""

    def __init__(self, source: Sequence[Mapping[str, Any]]) -> None:
        if not hasattr(source, "__len__") or not hasattr(source, "__getitem__"):
            raise ValueError(f"{type(self).__name__}: source must be indexable (a list of dicts or a "
                             f"datasets.Dataset), got {type(source).__name__}")
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> Example:
        return self.render(self.source[i], i)

    def render(self, row: Mapping[str, Any], index: int) -> Example:
        raise NotImplementedError

    def _field(self, row: Mapping[str, Any], key: str, index: int) -> str:
        try:
            value = row[key]
        except (KeyError, TypeError):
            keys = ", ".join(row) if isinstance(row, Mapping) else type(row).__name__
            raise ValueError(f"{type(self).__name__}: row {index} has no '{key}' (has: {keys})") from None
        if not isinstance(value, str):
            raise ValueError(f"{type(self).__name__}: row {index} '{key}' must be a string")
        return value


class PromptCompletionDataset(SegmentDataset):
    """``{"prompt": ..., "completion": ...}``; ``template`` formats the prompt (``{prompt}``)."""

    def __init__(self, source: Sequence[Mapping[str, Any]], prompt_key: str = "prompt",
                 completion_key: str = "completion", template: str = "{prompt}") -> None:
        super().__init__(source)
        self.prompt_key, self.completion_key, self.template = prompt_key, completion_key, template

    def render(self, row: Mapping[str, Any], index: int) -> Example:
        prompt = self.template.format(prompt=self._field(row, self.prompt_key, index))
        return [(prompt, False), (self._field(row, self.completion_key, index), True)]


class TextDataset(SegmentDataset):
    """Plain text, every token trained: ``{"text": ...}`` rows or bare strings."""

    def __init__(self, source: Sequence[Any], text_key: str = "text") -> None:
        super().__init__(source)
        self.text_key = text_key

    def render(self, row: Any, index: int) -> Example:
        return [(row if isinstance(row, str) else self._field(row, self.text_key, index), True)]


#: How a chat message is written; ``{role}`` and ``{content}`` are filled in.
DEFAULT_CHAT_TEMPLATE = "<|{role}|>\n{content}\n"


class ChatDataset(SegmentDataset):
    """OpenAI chat format: ``{"messages": [{"role": "system"|"user"|"assistant", "content": ...}]}``.

    Only the content of assistant messages (and the end-of-message text after
    it) is trained. ``render_fn(messages)`` can replace the template, for
    example with a tokenizer's chat template split into segments.
    """

    def __init__(self, source: Sequence[Any], messages_key: str = "messages", template: str = DEFAULT_CHAT_TEMPLATE,
                 train_roles: Sequence[str] = ("assistant",),
                 render_fn: Callable[[list[Mapping[str, str]]], Example] | None = None) -> None:
        super().__init__(source)
        self.messages_key, self.template, self.train_roles, self.render_fn = (
            messages_key, template, tuple(train_roles), render_fn)

    def messages(self, row: Any, index: int) -> list[Mapping[str, str]]:
        msgs = row[self.messages_key] if isinstance(row, Mapping) and self.messages_key in row else row
        if not isinstance(msgs, list) or not msgs:
            raise ValueError(f"{type(self).__name__}: row {index} needs a non-empty '{self.messages_key}' list")
        for m in msgs:
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(
                    m.get("content"), str):
                raise ValueError(f"{type(self).__name__}: row {index}: each message needs string 'role' "
                                 "and 'content'")
        return msgs

    def render(self, row: Any, index: int) -> Example:
        msgs = self.messages(row, index)
        if self.render_fn is not None:
            return self.render_fn(msgs)
        out: Example = []
        for m in msgs:
            head, sep, tail = self.template.partition("{content}")
            head = head.format(role=m["role"])
            if m["role"] in self.train_roles:
                out += [(head, False), (m["content"] + tail.format(role=m["role"]), True)]
            else:
                out.append((head + m["content"] + tail.format(role=m["role"]), False))
        return out


class MultiTurnDataset(ChatDataset):
    """Alternating turns ``{"turns": [user, assistant, user, assistant, ...]}`` (assistant trained)."""

    def __init__(self, source: Sequence[Any], turns_key: str = "turns", template: str = DEFAULT_CHAT_TEMPLATE,
                 system: str | None = None) -> None:
        super().__init__(source, messages_key=turns_key, template=template)
        self.system = system

    def messages(self, row: Any, index: int) -> list[Mapping[str, str]]:
        turns = row[self.messages_key] if isinstance(row, Mapping) else row
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise ValueError(f"MultiTurnDataset: row {index} needs a non-empty list of strings "
                             f"under '{self.messages_key}'")
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        msgs += [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
        return msgs


ALPACA_PROMPT = ("Below is an instruction that describes a task, paired with an input that provides further "
                 "context. Write a response that appropriately completes the request.\n\n"
                 "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
ALPACA_PROMPT_NO_INPUT = ("Below is an instruction that describes a task. Write a response that appropriately "
                          "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")


class AlpacaDataset(SegmentDataset):
    """Stanford Alpaca rows ``{"instruction", "input", "output"}`` with the Alpaca prompt."""

    def render(self, row: Mapping[str, Any], index: int) -> Example:
        instruction = self._field(row, "instruction", index)
        extra = row.get("input") or ""
        prompt = (ALPACA_PROMPT.format(instruction=instruction, input=extra) if extra
                  else ALPACA_PROMPT_NO_INPUT.format(instruction=instruction))
        return [(prompt, False), (self._field(row, "output", index), True)]

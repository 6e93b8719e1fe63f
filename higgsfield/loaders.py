"""Batches for LLaMA: distributed sampling, prompt masking, padding or packing.

::

    loader = LlamaLoader(dataset, tokenizer, max_sequence_length=2048, batch_size_per_gpu=8, packing=True)
    for step, batch in loader.iterate(start, max_steps=10_000):   # resumable: step -> batch is fixed
        loss = model(batch)

    for epoch in range(3):                                         # or epoch by epoch
        loader.set_epoch(epoch)
        for batch in loader: ...

Why it looks like this:

- The batch at global step ``s`` is a pure function of ``(seed, s)``: epoch
  ``s // len(loader)`` is a seeded shuffle, and the global batch is a contiguous
  slice of it, split over ranks. A resumed run, or one on another number of
  ranks with the same global batch, sees exactly the same data.
- Everything is tokenized once at construction, in batch calls (fast
  tokenizers do ~1M tokens/s); the tokenizer is passed in and nothing is downloaded.
- ``packing=True`` fills rows of ``max_sequence_length`` with whole examples
  (best-fit decreasing, done once) and gives each example its own positions,
  so attention does not cross examples; rows are then shuffled per epoch.
- Labels are ``-100`` on prompts (segments with ``train=False``), padding and
  the first token of each packed example.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from higgsfield._lib.tokenizer import view
from higgsfield.dataset import Example

__all__ = ["LlamaLoader", "IGNORE_INDEX"]

IGNORE_INDEX = -100
_BATCH = 4_096   # examples per batch call: a large dataset's texts are never all held at once


class LlamaLoader:
    """Tokenized, distributed batches of ``batch_size_per_gpu`` rows per rank.

    ``rank``/``world_size`` default to the process group's (or 0/1). ``len()`` is
    the number of steps in one epoch (incomplete global batches are dropped).
    """

    def __init__(self, dataset: Sequence[Example], tokenizer: Any, max_sequence_length: int,
                 batch_size_per_gpu: int, packing: bool = False, shuffle: bool = True, seed: int = 0,
                 pad_to_multiple_of: int = 8, rank: int | None = None, world_size: int | None = None) -> None:
        if max_sequence_length < 2:
            raise ValueError(f"max_sequence_length must be at least 2, got {max_sequence_length}")
        if batch_size_per_gpu < 1:
            raise ValueError(f"batch_size_per_gpu must be at least 1, got {batch_size_per_gpu}")
        self.tokenizer = tokenizer   # as given: a Checkpoint saves it with each step (its hf/ directory)
        self.tok = view(tokenizer)
        self.max_sequence_length = max_sequence_length
        self.batch_size_per_gpu = batch_size_per_gpu
        self.packing, self.shuffle, self.seed = packing, shuffle, seed
        self.pad_to_multiple_of = max(1, pad_to_multiple_of)
        if rank is None or world_size is None:
            import torch.distributed as dist
            initialised = dist.is_initialized()
            rank = dist.get_rank() if initialised else 0
            world_size = dist.get_world_size() if initialised else 1
        self.rank, self.world_size = rank, world_size
        self.examples = self._tokenize_all(dataset)
        self.rows = _pack(self.examples, max_sequence_length) if packing else [[i] for i in
                                                                                range(len(self.examples))]
        self.epoch = 0
        self._cached_order: tuple[int, list[int]] | None = None
        if len(self) == 0:
            raise ValueError(f"the dataset gives {len(self.rows)} rows, fewer than one global batch of "
                             f"{self.global_batch_size} ({batch_size_per_gpu} per rank x {world_size} ranks)")

    @property
    def global_batch_size(self) -> int:
        return self.batch_size_per_gpu * self.world_size

    def __len__(self) -> int:
        return len(self.rows) // self.global_batch_size

    def _tokenize_all(self, dataset: Sequence[Example]) -> list[tuple[list[int], list[int]]]:
        """Every example's (ids, labels): ``_BATCH`` examples at a time, their segments in one batch call."""
        out = []
        for start in range(0, len(dataset), _BATCH):
            examples = [list(dataset[i]) for i in range(start, min(start + _BATCH, len(dataset)))]
            ids = self.tok.encode_many([text for example in examples for text, _ in example])
            k = 0
            for example in examples:
                out.append(self._assemble(example, ids[k:k + len(example)]))
                k += len(example)
        return out

    def _assemble(self, example: Example, segments: list[list[int]]) -> tuple[list[int], list[int]]:
        ids: list[int] = []
        labels: list[int] = []
        if self.tok.bos_id is not None:
            ids.append(self.tok.bos_id)
            labels.append(IGNORE_INDEX)
        train = False
        for (_, train), toks in zip(example, segments, strict=True):
            ids += toks
            labels += toks if train else [IGNORE_INDEX] * len(toks)
        if self.tok.eos_id is not None:
            ids.append(self.tok.eos_id)
            labels.append(self.tok.eos_id if train else IGNORE_INDEX)  # learn to stop after an answer
        n = self.max_sequence_length
        return ids[:n], labels[:n]

    # -- sampling -----------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Choose the shuffle used by ``iter(loader)`` (like DistributedSampler.set_epoch)."""
        self.epoch = epoch

    def _order(self, epoch: int) -> list[int]:
        if self._cached_order is not None and self._cached_order[0] == epoch:
            return self._cached_order[1]
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        self._cached_order = (epoch, order)
        return order

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        """This rank's part of the global batch at global step ``step``."""
        epoch, i = divmod(step, len(self))
        order = self._order(epoch)
        start = i * self.global_batch_size + self.rank * self.batch_size_per_gpu
        rows = [self.rows[j] for j in order[start:start + self.batch_size_per_gpu]]
        return self._collate(rows)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for i in range(len(self)):
            yield self.batch(self.epoch * len(self) + i)

    def iterate(self, start: int = 0, max_steps: int | None = None) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
        """``(step, batch)`` from ``start`` up to ``max_steps`` (default: one epoch), across epochs."""
        end = len(self) if max_steps is None else max_steps
        for step in range(start, end):
            self.epoch = step // len(self)
            yield step, self.batch(step)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint records to check the data order on resume."""
        return {"seed": self.seed, "global_batch_size": self.global_batch_size, "rows": len(self.rows),
                "packing": self.packing, "epoch": self.epoch}

    # -- collation ----------------------------------------------------------------------------

    def _collate(self, rows: list[list[int]]) -> dict[str, torch.Tensor]:
        seqs = []
        for row in rows:
            ids: list[int] = []
            labels: list[int] = []
            pos: list[int] = []
            for k in row:
                e_ids, e_labels = self.examples[k]
                ids += e_ids
                labels += [IGNORE_INDEX] + e_labels[1:] if self.packing else e_labels
                pos += range(len(e_ids))
            seqs.append((ids, labels, pos))
        longest = max(len(s[0]) for s in seqs)
        m = self.pad_to_multiple_of
        width = min(self.max_sequence_length, -(-longest // m) * m) if not self.packing else self.max_sequence_length
        pad = self.tok.pad_id
        # Plain lists, one tensor each: much cheaper than filling tensors row by row.
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _, _ in seqs])
        labels_t = torch.tensor([labels + [IGNORE_INDEX] * (width - len(labels)) for _, labels, _ in seqs])
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _, _ in seqs])
        # the padding is its own "sequence" of positions, so packed rows stay block-diagonal
        position_ids = torch.tensor([pos + list(range(width - len(pos))) for _, _, pos in seqs])
        batch = {"input_ids": input_ids, "labels": labels_t, "num_tokens": mask.sum()}
        if self.packing:
            batch["position_ids"] = position_ids  # per-example positions keep examples apart
        else:
            batch["attention_mask"] = mask
        return batch


def _pack(examples: list[tuple[list[int], list[int]]], capacity: int) -> list[list[int]]:
    """Best-fit decreasing: whole examples into as few rows of ``capacity`` tokens as it finds."""
    by_length = sorted(range(len(examples)), key=lambda i: (-len(examples[i][0]), i))
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # sorted (free space, row index)
    for i in by_length:
        n = len(examples[i][0])
        j = bisect.bisect_left(free, (n, -1))
        if j < len(free):
            space, r = free.pop(j)
            rows[r].append(i)
            bisect.insort(free, (space - n, r))
        else:
            rows.append([i])
            bisect.insort(free, (capacity - n, len(rows) - 1))
    return rows

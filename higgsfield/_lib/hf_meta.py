"""A checkpoint step's Hugging Face metadata: ``step_*/hf/`` with ``config.json`` and the tokenizer's files.

Written by rank 0 at each save, into the step's temporary directory before it is
renamed (:meth:`higgsfield.checkpoint.Checkpoint.save`), so every complete step
carries what :mod:`higgsfield._lib.hf_export` needs to make it a ``transformers``
directory later, on a machine that has neither the model's code nor its tokenizer:
the weights alone (DCP shards, DeepSpeed partitions) do not say which architecture
they are. It is a few kilobytes, so every save writes it, and in node-local mode
it lies in node 0's part, which ``higgsfield pull`` and a mirror carry like any
other file of it.

A model without a ``config`` that can save itself (a plain ``nn.Module``) writes
nothing: such a step is still a checkpoint, just not an exportable one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

HF_DIR = "hf"
CONFIG = "config.json"


def write_hf_meta(model: Any, tokenizer: Any, directory: Path) -> bool:
    """Write ``model.config`` (and ``tokenizer``, if any) into ``directory``; False when the model has no config.

    Each file is fsync'd: the step's ``COMPLETE`` marker, written after, must never
    promise a file that a crash could still lose.
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "save_pretrained"):
        return False
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(directory)
    for path in directory.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    return True

"""A complete checkpoint step as a ``transformers`` directory: safetensors weights, ``config.json``, tokenizer.

::

    python -m higgsfield._lib.hf_export pulled/run/step_00000400 pulled/run/hf/step_00000400
    # or: export_step(Path("pulled/run/step_00000400"), Path("pulled/run/hf/step_00000400"))
    model = AutoModelForCausalLM.from_pretrained("pulled/run/hf/step_00000400")

The step must be whole in one directory: one saved in ``shared`` mode, or one that
``higgsfield pull`` merged from every node's part (a single node's part of a
node-local step holds only its ranks' shards, so it is refused). The architecture
comes from the step's ``hf/`` (:mod:`higgsfield._lib.hf_meta`, written at each save).

How the weights are read, one process, no process group, CPU only:

- FSDP2 (torch.distributed.checkpoint, ``.metadata`` + ``.distcp``): the metadata
  lists every tensor with its global shape and dtype, so an empty tensor is made
  for each ``model.*`` key alone and ``dcp.load(..., no_dist=True)`` fills them.
  Not ``format_utils.dcp_to_torch_save``: it loads the optimizer's moments too,
  three times the model's memory, and writes a torch.save file to read again.
- DeepSpeed (``deepspeed/``): DeepSpeed's own consolidation,
  ``zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(step, tag="deepspeed")``:
  the fp32 master weights (the module's own in fp32 training, their full-precision
  copy in bf16/fp16 training).

The names are checked against the architecture built on the meta device (no
memory): a missing weight would otherwise load as random values with a warning.
With tied embeddings ``lm_head.weight`` is left out (transformers ties it back).
The directory is written under a temporary name and renamed, so ``out`` is either
a whole export or absent. Errors the user can fix are :class:`ExportError`, one
line, exit 2; ``higgsfield pull --hf`` runs this module in its own process, since
the control side never imports torch.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from higgsfield._lib.hf_meta import CONFIG, HF_DIR
from higgsfield.contract.errors import RunError

__all__ = ["ExportError", "export_step"]

MARKER = "COMPLETE"
_DCP_PREFIX = "model."   # Checkpoint saves {"model": msd, "optim": osd}: DCP keys are "model.<hf fqn>"


class ExportError(RunError):
    """A step that cannot be exported as it is (not whole, no config), or a missing package: the user's to fix."""

    exit_code = 2


def export_step(step_dir: Path, out: Path) -> Path:
    """Write ``step_dir``'s model as a ``transformers`` directory at ``out`` (replaced if there); returns ``out``."""
    step_dir, out = Path(step_dir), Path(out)
    meta = _check_step(step_dir)
    try:
        import torch
        from huggingface_hub import save_torch_state_dict
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError as e:
        raise ExportError(f"exporting {step_dir.name} to Hugging Face needs torch and transformers here "
                          f"({e.name or e} is missing): reinstall higgsfield from its repository with the 'train' extra (README: Install)") from None
    config = AutoConfig.from_pretrained(meta)
    state = _deepspeed_weights(step_dir) if (step_dir / "deepspeed").is_dir() else _dcp_weights(step_dir)
    with torch.device("meta"):
        expected = set(AutoModelForCausalLM.from_config(config).state_dict())
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
        expected.discard("lm_head.weight")
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ExportError(f"{step_dir.name}'s weights do not fit its {HF_DIR}/{CONFIG} "
                          f"({getattr(config, 'model_type', '?')}): missing {missing[:3]}, unexpected "
                          f"{unexpected[:3]}; was the model changed after it was built?")
    tmp = out.with_name(f".tmp-{out.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_torch_state_dict({k: v.contiguous() for k, v in state.items()}, tmp)
        for f in sorted(meta.iterdir()):
            if f.is_file():
                shutil.copy2(f, tmp / f.name)
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _check_step(step_dir: Path) -> Path:
    """The step's ``hf/`` directory, once the step is known whole and exportable; ExportError otherwise."""
    marker = step_dir / MARKER
    if not marker.is_file():
        raise ExportError(f"{step_dir} is not a complete checkpoint step (no {MARKER}): "
                          "pull it with 'higgsfield pull RUN' first")
    try:
        mode = json.loads(marker.read_text()).get("mode")
    except (ValueError, AttributeError):
        mode = None
    if mode == "node-local":
        raise ExportError(f"{step_dir} is one node's part of a node-local checkpoint: bring every node's part "
                          "into one step with 'higgsfield pull RUN --hf'")
    meta = step_dir / HF_DIR
    if not (meta / CONFIG).is_file():
        raise ExportError(f"{step_dir.name} has no Hugging Face config ({HF_DIR}/{CONFIG}): it was saved from a "
                          "model that isn't a higgsfield Llama (no .config to save), so it cannot be exported")
    return meta


def _dcp_weights(step_dir: Path) -> dict[str, Any]:
    """The ``model.*`` tensors of a DCP step, loaded on this process alone (see the module docstring)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(str(step_dir))
    metadata = reader.read_metadata()
    state = {key: torch.empty(m.size, dtype=m.properties.dtype)
             for key, m in metadata.state_dict_metadata.items()
             if key.startswith(_DCP_PREFIX) and isinstance(m, TensorStorageMetadata)}
    if not state:
        raise ExportError(f"{step_dir.name}'s .metadata holds no model weights ({_DCP_PREFIX}*): "
                          "it was not saved by higgsfield.checkpoint")
    dcp.load(state, storage_reader=reader, no_dist=True)
    return {key[len(_DCP_PREFIX):]: t for key, t in state.items()}


def _deepspeed_weights(step_dir: Path) -> dict[str, Any]:
    """The full fp32 weights of a DeepSpeed step, consolidated by DeepSpeed's zero_to_fp32 on CPU."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # this process only: DeepSpeed probes for one at import
    try:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    except ImportError as e:
        raise ExportError(f"{step_dir.name} was saved by DeepSpeed; exporting it needs deepspeed here "
                          f"({e.name or e} is missing): reinstall higgsfield from its repository with the 'train' extra (README: Install)") from None
    return dict(get_fp32_state_dict_from_zero_checkpoint(str(step_dir), tag="deepspeed"))


def main(argv: list[str]) -> int:
    """``python -m higgsfield._lib.hf_export STEP_DIR OUT``: prints OUT; an ExportError is one line on stderr, exit 2."""
    if len(argv) != 2:
        print("usage: python -m higgsfield._lib.hf_export STEP_DIR OUT", file=sys.stderr)
        return 2
    try:
        print(export_step(Path(argv[0]), Path(argv[1])))
    except ExportError as e:
        print(f"higgsfield: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

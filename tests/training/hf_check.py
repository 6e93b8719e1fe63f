"""A node-local step merged as ``higgsfield pull`` merges it, converted by ``pull --hf``'s export, then loaded.

``merge_local(parts, dest)`` lays the nodes' parts of one step side by side with the
pull's own :func:`~higgsfield.control.backends.nodes.pull.merge_parts` and
:func:`~higgsfield.control.backends.nodes.pull.write_marker` (the copy over SSH is tested in
tests/control/test_pull.py and on the bed); ``hf_logits(directory, saved)`` loads an exported
directory with ``transformers``' ``AutoModelForCausalLM.from_pretrained`` in a fresh
process and returns the largest difference between its logits and the ones the trained
model gave on the same batch (tiny_llama's ``logits_file``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from higgsfield.control.backends.nodes.pull import RemoteFile, export_hf, merge_parts, write_marker

LOGITS = r'''
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
directory, saved = sys.argv[1], torch.load(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32).eval()
tok = AutoTokenizer.from_pretrained(directory)
with torch.no_grad():
    got = model(input_ids=saved["input_ids"], attention_mask=saved["attention_mask"], use_cache=False).logits
tokens = tok.convert_ids_to_tokens(tok("12+34=")["input_ids"])
print(json.dumps({"max_diff": float((got.float() - saved["logits"]).abs().max()),
                  "shape": list(got.shape), "vocab": len(tok), "sum": "".join(tokens)}))
'''


def merge_local(parts: list[Path], dest: Path) -> Path:
    """Node 0's part first: every file of ``parts`` (one step's directory on each node) merged into ``dest``."""
    listed = []
    for n, part in enumerate(parts):
        files = [p for p in sorted(part.rglob("*")) if p.is_file() and p.name != "COMPLETE"]
        listed.append([RemoteFile(f"node{n}", str(p), str(p.relative_to(part)), p.stat().st_size,
                                  hashlib.sha256(p.read_bytes()).hexdigest()) for p in files])
    for f in merge_parts(listed):
        (dest / f.rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f.path, dest / f.rel)
    write_marker(dest, json.loads((parts[0] / "COMPLETE").read_text()), "r", [f"node{n}" for n in range(len(parts))])
    return dest


def hf_logits(directory: Path, saved: Path) -> dict:
    """Load ``directory`` with from_pretrained (a fresh process) and compare its logits with ``saved``'s."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HIGGSFIELD_", "RANK", "WORLD_SIZE"))}
    r = subprocess.run([sys.executable, "-c", LOGITS, str(directory), str(saved)], capture_output=True, text=True,
                       timeout=180, env={**env, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def export_and_compare(parts: list[Path], tmp: Path, saved: Path) -> dict:
    """What ``higgsfield pull RUN --hf`` does after its copy, then the logits check; the check's figures."""
    merged = merge_local(parts, tmp / "pulled" / parts[0].name)
    out = export_hf(merged, tmp / "pulled" / "hf" / parts[0].name)
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "tokenizer.json"} <= names and any(n.endswith(".safetensors") for n in names), names
    return hf_logits(out, saved)

"""Loading a pulled checkpoint on one rank, in a process of its own (a process group of world size 1).

``load_step(directory, width, out)`` loads the newest step of ``directory`` with the library's
:class:`~higgsfield.checkpoint.Checkpoint` (``mode="checkpoint"``: the ``COMPLETE`` marker and
topology checks included) or one step directory with DCP alone (``mode="dcp"``: a node's own part,
which a Checkpoint of another world size refuses), into a ``torch.nn.Linear(width, width)`` and
AdamW, as ``src/ckpt_steps.py`` trains them, and ``torch.save``s ``{"model", "optim", "step",
"missing"}`` to ``out``: ``missing`` lists the files the step's ``.metadata`` names that are not there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

LOAD = r'''
import json, sys
from pathlib import Path
import torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from higgsfield.checkpoint import Checkpoint

mode, where, width, out = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo", init_method="file://" + out + ".store", rank=0, world_size=1)
model = torch.nn.Linear(width, width)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
if mode == "checkpoint":
    ck = Checkpoint(model, opt, directory=where)
    step_dir = ck.latest()
    step = ck.load_latest()
else:
    step_dir, step = where, None
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(where))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
meta = FileSystemReader(str(step_dir)).read_metadata()
named = {info.relative_path for info in meta.storage_data.values()}
missing = sorted(n for n in named if not (step_dir / n).is_file())
msd, osd = get_state_dict(model, opt)
torch.save({"model": msd, "optim": osd, "step": step, "missing": missing, "files": sorted(named)}, out)
dist.destroy_process_group()
print(json.dumps({"step": step, "missing": missing}))
'''


def load_step(where: Path, width: int, out: Path, *, mode: str = "checkpoint", timeout: float = 120) -> dict:
    """Load ``where`` on one rank (see the module docstring); the saved state, read back."""
    import torch

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HIGGSFIELD_", "RANK", "WORLD_SIZE"))}
    r = subprocess.run([sys.executable, "-c", LOAD, mode, str(where), str(width), str(out)], capture_output=True,
                       text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    json.loads(r.stdout.strip().splitlines()[-1])
    return dict(torch.load(out, weights_only=False))


def assert_same_state(a: dict, b: dict) -> None:
    """Model tensors and every optimizer state tensor equal (bit for bit: a checkpoint is a copy)."""
    import torch

    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    sa, sb = a["optim"]["state"], b["optim"]["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        for name in sa[k]:
            x, y = sa[k][name], sb[k][name]
            assert torch.equal(torch.as_tensor(x), torch.as_tensor(y)), (k, name)

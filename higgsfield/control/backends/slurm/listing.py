"""The script the login node runs to list a project's runs: every run directory's job.json and run.json.

One JSON list in one round trip (``python3 -c``), read by
:meth:`~higgsfield.control.backends.slurm.client.SlurmCluster.statuses`. Its own module
because it is code for the other side: it runs on the login node with its python3, so it
imports nothing of higgsfield.
"""

from __future__ import annotations

#: Run on the login node: every run directory's job.json and run.json, as one JSON list (one round trip).
_LIST_RUNS = """\
import json, os, sys
root, out = sys.argv[1], []
try:
    names = sorted(os.listdir(root))
except OSError:
    names = []
for name in names:
    item = {"run": name}
    for key, file in (("job", "job.json"), ("record", "run.json")):
        try:
            with open(os.path.join(root, name, file)) as f:
                item[key] = json.load(f)
        except (OSError, ValueError):
            pass
    if "job" in item:
        out.append(item)
print(json.dumps(out))
"""

"""What buddy copies cost training: a step that saves, node-local only vs node-local with buddy copies.

    .venv/bin/python bench/buddy_copy.py                 # 2 "nodes" x 1 rank, 2 rounds
    .venv/bin/python bench/buddy_copy.py --width 2048 --saves 6

The harness of ``bench/checkpoint_mirror.py`` (two torchrun agents on 127.0.0.1, a
checkpoint directory each, an FSDP2 MLP saved every ``--every`` steps; rank 0
times every step as training sees it), run in two modes that alternate for
``--rounds`` rounds: ``HIGGSFIELD_CHECKPOINT_BUDDIES=0`` (each node keeps its own
part only: the baseline) and the default (each node also sends its part to the
other and receives the other's, in a background thread over a gloo group of
the node leads). The save's own cost is the saving step minus the plain step
(which cancels a machine that is slower or faster during one launch). Target:
what the copies add to a step that saves, (cost with copies - cost without) /
saving step without, is <= 5%. The drain is how long the last copy took to
finish after training ended (what ``wait_uploads`` waits for).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checkpoint_mirror import one_mode  # noqa: E402 - the same worker and launcher

TARGET = 0.05
MODES = {"node-local only": {"HIGGSFIELD_CHECKPOINT_BUDDIES": "0"}, "buddy copies": {}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--saves", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="the modes alternate this many times")
    args = ap.parse_args()
    params = args.layers * args.width * (args.width + 1)
    print(f"buddy copies: 2 nodes x 1 rank, {params / 1e6:.1f}M params (~{params * 12 / 2**20:.0f} MiB a "
          f"checkpoint, half of it per node), a save every {args.every} steps, {args.saves} timed saves")
    results: dict[str, dict[str, Any]] = {m: {"plain": [], "saving": [], "drain": []} for m in MODES}
    with tempfile.TemporaryDirectory() as d:
        for k in range(args.rounds):
            for m, env in MODES.items():
                r = one_mode(args, Path(d), f"{m.split()[0]}-r{k}", env)
                for key in ("plain", "saving"):
                    results[m][key] += r[key]
                results[m]["drain"].append(r["drain"])

    def cost(r: dict[str, Any]) -> float:
        return statistics.median(r["saving"]) - statistics.median(r["plain"])

    base = results["node-local only"]
    base_saving = statistics.median(base["saving"])
    print(f"{'mode':<16} {'plain step':>11} {'saving step':>12} {'save cost':>10} {'added':>7} {'drain':>8}")
    for mode, r in results.items():
        added = (cost(r) - cost(base)) / base_saving
        print(f"{mode:<16} {statistics.median(r['plain']) * 1e3:>9.1f}ms {statistics.median(r['saving']) * 1e3:>10.1f}ms "
              f"{cost(r) * 1e3:>8.1f}ms {added:>+7.1%} {statistics.median(r['drain']) * 1e3:>6.0f}ms")
    added = (cost(results["buddy copies"]) - cost(base)) / base_saving
    print(f"target: buddy copies add <= {TARGET:.0%} to a step that saves: {'met' if added <= TARGET else 'NOT met'} "
          f"({added:+.1%})")


if __name__ == "__main__":
    main()

"""bench/gpu_suite.py --dry-run (issue 31): the GPU suite's every part on CPU, tiny, so it is ready when a GPU
is lent. One run of the real script (its workers, ``higgsfield init`` + ``run example`` on localhost, ``doctor``,
the fabric worker), then the table it writes: its columns, a row per part, and the figures in the cells."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import gpu_suite  # noqa: E402

NUMBER = re.compile(r"^[\d,]+(\.\d+)?")


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_dry_run_writes_one_table_with_a_row_per_part(tmp_path: Path) -> None:
    out = tmp_path / "table.md"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_suite.py"), "--dry-run", "--out", str(out)],
                          capture_output=True, text=True, timeout=280, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert proc.stdout == text
    lines = text.splitlines()
    assert lines[0].startswith("GPU suite on CPU (dry run"), lines[0]
    table = [x for x in lines if x.startswith("|")]
    assert tuple(cells(table[0])) == gpu_suite.COLUMNS and set(table[1]) <= {"|", "-"}
    rows = [cells(x) for x in table[2:]]
    assert all(len(r) == len(gpu_suite.COLUMNS) for r in rows), rows
    by = {(r[0].split(" bf16")[0].split()[0], r[1]): dict(zip(gpu_suite.COLUMNS, r, strict=True)) for r in rows}

    train = [r for r in rows if r[0].startswith("Llama ")]
    assert [r[1] for r in train] == [
        "FSDP2, eager, AC off", "FSDP2, eager, AC on", "FSDP2, compiled, AC off", "FSDP2, compiled, AC on",
        "DeepSpeed ZeRO-3, eager, AC off", "DeepSpeed ZeRO-3, eager, AC on"]
    for r in train:
        row = dict(zip(gpu_suite.COLUMNS, r, strict=True))
        assert row["result"] == "ok", r
        assert NUMBER.match(row["tokens/s"]) and float(row["tokens/s"].replace(",", "")) > 0, r
        assert row["vs first"].endswith("x") and row["seconds"].endswith("a step"), r
        assert row["MFU"] == "n/a" and row["peak mem (GiB)"] == "n/a", r     # CPU: no peak FLOP/s, no CUDA memory
    assert train[0][3] == "1.00x"

    ckpt = [dict(zip(gpu_suite.COLUMNS, r, strict=True)) for r in rows if r[0] == "Checkpoint"]
    assert [c["config"].split(" (")[0] for c in ckpt] == ["save, sync", "save, async", "load"]
    for c in ckpt:
        assert c["result"] == "ok" and float(c["seconds"]) > 0, c
    sync, later = ckpt[0], ckpt[1]
    assert float(sync["blocked (s)"]) == float(sync["seconds"])
    assert 0 < float(later["blocked (s)"]) <= float(later["seconds"])   # async: blocked for part of it only

    run = by[("higgsfield", "scaffold example, localhost, process runtime")]
    assert run["part"] == "higgsfield run" and run["result"].startswith("ok:") and "device=cpu" in run["result"], run
    doctor = next(dict(zip(gpu_suite.COLUMNS, r, strict=True)) for r in rows if r[0] == "higgsfield doctor")
    assert doctor["result"].startswith("ok: GPUs: "), doctor
    fabric_cli = next(dict(zip(gpu_suite.COLUMNS, r, strict=True)) for r in rows if r[0] == "higgsfield doctor --fabric")
    assert "needs at least 2 nodes" in fabric_cli["result"], fabric_cli   # one machine: the CLI's own line
    worker = next(dict(zip(gpu_suite.COLUMNS, r, strict=True)) for r in rows if r[0] == "fabric test worker")
    assert worker["config"] == "gloo, 1 rank" and worker["result"].startswith("ok: gloo: "), worker
    assert "ckpt write" in worker["result"]
    assert len(rows) == 6 + 3 + 3 + 1


@pytest.mark.timeout(30)
def test_gpu_figures_and_failed_parts_in_the_table(tmp_path: Path) -> None:
    """The cells as a GPU run fills them (MFU, memory), and a part that overran or never ran is a row saying so."""
    rows = [{"task": "train:fsdp:0:0", "ok": True, "tokens_per_s": 20000.0, "step_s": 0.41, "mfu": 0.382,
             "peak_gib": 31.26, "params": 1.1e9, "wall_s": 40.0},
            {"task": "train:fsdp:1:0", "ok": True, "tokens_per_s": 25000.0, "step_s": 0.33, "mfu": 0.478,
             "peak_gib": 29.0, "params": 1.1e9, "wall_s": 80.0},
            {"task": "train:fsdp:1:1", "ok": False, "error": "timed out after 150s", "wall_s": 150.0}]
    rows += gpu_suite.run_workers(["checkpoint"], dry=True, work=tmp_path, timeout=0, env={})
    text = gpu_suite.table(rows, dry=False, device="NVIDIA H100 80GB HBM3")
    assert text.startswith("GPU suite on NVIDIA H100 80GB HBM3, ")
    got = {(c[0], c[1]): c for c in (cells(x) for x in text.splitlines()[4:])}
    base = got[("Llama 1.10B bf16, 1 GPU", "FSDP2, eager, AC off")]
    assert base[2:8] == ["20,000", "1.00x", "38.2%", "31.3", "0.410 a step", ""] and base[8] == "ok"
    assert got[("Llama 1.10B bf16, 1 GPU", "FSDP2, compiled, AC off")][3] == "1.25x"
    assert got[("Llama bf16, 1 GPU", "FSDP2, compiled, AC on")][8] == "failed: timed out after 150s"
    assert got[("Llama bf16, 1 GPU", "DeepSpeed ZeRO-3, eager, AC off")][8] == "failed: not run"
    assert got[("Checkpoint", "load (sync save)")][8] == "failed: not run: the suite's time was spent"

"""The GPU suite (issue 31): one script, one Markdown table, for the minutes a GPU is lent.

    .venv/bin/python bench/gpu_suite.py --out gpu_suite.md     # one H100/H200: at most 8 minutes
    python bench/gpu_suite.py --out "$OUT/gpu_suite.md"        # on a lent machine (the run tool's $OUT)
    .venv/bin/python bench/gpu_suite.py --dry-run              # the same code paths on CPU, tiny, no GPU

What it measures, each part in a process of its own (a part that crashes, runs out of memory or
overruns its share of the time is a row saying so; the others go on):

- ``Llama`` of 1.1B parameters (TinyLlama-1.1B's shape: 22 layers, hidden 2048, GQA 32/4, vocab
  32000) in bf16 on 1 GPU, 4 x 2048 tokens a step: tokens/s, MFU (``StepTimer``'s, against the
  GPU's dense bf16 peak) and peak memory, FSDP2 eager and ``torch.compile``-d (each decoder layer's
  forward, as torchtitan compiles per block; FSDP2's hooks stay outside the graph), with activation checkpointing off and on; the ratio is against the first
  row (FSDP2, eager, no checkpointing), run in the same script;
- the same with DeepSpeed ZeRO-3, activation checkpointing off and on (not compiled: ZeRO-3's
  parameter hooks break dynamo's graphs, and its compile costs minutes the suite does not have);
- a ``Checkpoint`` of that model with its AdamW state: a synchronous save, an asynchronous save
  (seconds to durable, and the time training is blocked: in ``save`` plus in the ``wait`` after 3
  training steps), and a load;
- ``higgsfield init``'s scaffold example run with ``higgsfield run example`` on ``localhost``
  with the process runtime, on the GPU (``--param device=cuda``);
- ``higgsfield doctor`` on that project (the GPUs check is nvidia-smi/NVML's), and ``doctor
  --fabric``: with one machine it refuses (two nodes needed; its line is the row), so the fabric
  test's own worker (:mod:`higgsfield._lib.fabric_bench`) also runs on the GPU's one rank: nccl's
  start and all-reduce sweep, NVML's free memory and health, the checkpoint directory's write MB/s.

Nothing outside the machine is reached: the model is random-initialised from a config, the data
is random tokens, the project lives in a temporary directory. ``--dry-run`` runs every part on
CPU with a 2-layer model, 3 steps and ``torch.compile(backend="aot_eager")`` (dynamo and
AOTAutograd without code generation), in one worker process, in well under a minute;
tests/test_gpu_suite.py runs it and checks the table's rows and columns.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MARK = "GPU_SUITE "
BUDGET_S = 480.0
COLUMNS = ("part", "config", "tokens/s", "vs first", "MFU", "peak mem (GiB)", "seconds", "blocked (s)", "result")

GPU_MODEL = {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
             "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 2048}
TINY_MODEL = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
TRAIN = [  # (engine, compile, activation checkpointing): the first is the baseline of "vs first"
    ("fsdp", False, False), ("fsdp", False, True), ("fsdp", True, False), ("fsdp", True, True),
    ("deepspeed", False, False), ("deepspeed", False, True)]


@dataclass
class Preset:
    model: dict[str, int]
    batch: int
    seq: int
    warmup: int
    steps: int
    compile_backend: str
    timeouts: dict[str, float] = field(default_factory=dict)


GPU = Preset(GPU_MODEL, 4, 2048, 3, 8, "inductor",
             {"train": 75, "train_compile": 150, "train_deepspeed": 90, "checkpoint": 120, "fabric": 60,
              "cli": 90})
DRY = Preset(TINY_MODEL, 2, 32, 1, 2, "aot_eager",
             {"torch": 240, "fabric": 60, "cli": 90})


# -- the worker side (torch imported here only) ------------------------------------------------------------------

def _model(p: Preset, engine: str, ac: bool) -> Any:
    from transformers import LlamaConfig

    from higgsfield.llama import Llama

    return Llama(LlamaConfig(**p.model), engine=engine, zero_stage=3, precision="bf16", activation_checkpointing=ac,
                 cpu_init_rank0=False, seed=0)


def _batch(p: Preset) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, p.model["vocab_size"], (p.batch, p.seq), generator=gen)
    return {"input_ids": ids, "labels": ids.clone()}


def _steps(model: Any, opt: Any, batch: dict[str, Any], n: int) -> None:
    for _ in range(n):
        loss = model(batch)
        model.backward(loss)
        model.step(opt)


def train_task(p: Preset, engine: str, compiled: bool, ac: bool) -> dict[str, Any]:
    """Warm up, then time ``p.steps`` steps with the library's own ``StepTimer`` (tokens/s, MFU, memory)."""
    import torch

    from higgsfield.training import StepTimer, init_distributed

    init_distributed()
    t0 = time.perf_counter()
    model = _model(p, engine, ac)
    opt = model.make_optimizer(torch.optim.AdamW, lr=1e-4)
    if compiled:   # each decoder layer's forward, as torchtitan compiles per block; FSDP2's hooks stay outside
        import torch._dynamo

        for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit"):
            if hasattr(torch._dynamo.config, name):   # 22 layers share one code object: no eager fallback at 8
                setattr(torch._dynamo.config, name, max(256, getattr(torch._dynamo.config, name)))
        for layer in model.module.model.layers:
            layer.forward = torch.compile(layer.forward, backend=p.compile_backend)
    batch = _batch(p)
    _steps(model, opt, batch, p.warmup)
    timer = StepTimer(model.flops_per_token(p.seq), log=None)
    metrics = []
    for i in range(p.steps):
        loss = model(batch)
        model.backward(loss)
        model.step(opt)
        metrics.append(timer.step(i, loss, p.batch * p.seq))
    seconds = sum(m.step_time_s for m in metrics)
    mfus = [m.mfu for m in metrics if m.mfu is not None]
    out = {"tokens_per_s": p.batch * p.seq * p.steps / seconds, "step_s": seconds / p.steps,
           "mfu": sum(mfus) / len(mfus) if mfus else None,
           "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
           "params": _param_count(p), "setup_s": time.perf_counter() - t0 - seconds,
           "loss": float(metrics[-1].loss)}
    del model, opt
    _free()
    return out


def _param_count(p: Preset) -> int:
    from transformers import LlamaConfig

    from higgsfield._lib.hf_model import param_count

    return int(param_count(LlamaConfig(**p.model)))


def _free() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def checkpoint_task(p: Preset, work: Path) -> dict[str, Any]:
    """A synchronous save, an asynchronous one with 3 steps trained while it writes, a load; FSDP2, AC on."""
    import torch

    from higgsfield.checkpoint import Checkpoint
    from higgsfield.training import init_distributed

    init_distributed()
    model = _model(p, "fsdp", True)
    opt = model.make_optimizer(torch.optim.AdamW, lr=1e-4)
    batch = _batch(p)
    _steps(model, opt, batch, 1)   # the optimizer state exists: it is saved too
    out: dict[str, Any] = {}
    sync = Checkpoint(model, opt, directory=work / "sync", keep_last=1, mirror="", buddies=False)
    t0 = time.perf_counter()
    sync.save(0)
    out["sync_s"] = time.perf_counter() - t0
    out["gb"] = _du(work / "sync") / 1e9
    later = Checkpoint(model, opt, directory=work / "async", keep_last=1, mirror="", buddies=False, async_save=True)
    t0 = time.perf_counter()
    later.save(1)
    in_save = time.perf_counter() - t0
    _steps(model, opt, batch, 3)
    t1 = time.perf_counter()
    later.wait()
    t2 = time.perf_counter()
    out["async_s"], out["async_blocked_s"] = t2 - t0, in_save + (t2 - t1)
    loader = Checkpoint(model, opt, directory=work / "sync", keep_last=1, mirror="", buddies=False)
    t0 = time.perf_counter()
    step = loader.load_latest()
    out["load_s"], out["loaded_step"] = time.perf_counter() - t0, step
    del model, opt
    _free()
    return out


def fabric_task(p: Preset, work: Path) -> dict[str, Any]:
    """The fabric test's worker on this machine's one rank (its own process group: env://)."""
    import contextlib
    import io
    from types import SimpleNamespace

    from higgsfield._lib.fabric_bench import fabric
    from higgsfield.contract.fabric import MARKER

    os.environ["HIGGSFIELD_CHECKPOINT_DIR"] = str(work)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        fabric(SimpleNamespace(min_bytes=8, max_bytes=(64 << 20) if p is GPU else (1 << 20), pair_bytes=1 << 20,
                               ckpt_mib=64 if p is GPU else 4))
    line = next(x for x in buf.getvalue().splitlines() if x.startswith(MARKER))
    result: dict[str, Any] = json.loads(line[len(MARKER):])
    return result


def worker(args: argparse.Namespace) -> None:
    p = DRY if args.dry_run else GPU
    work = Path(args.work)
    for task in args.tasks:
        t0 = time.perf_counter()
        try:
            if task.startswith("train:"):
                engine, compiled, ac = task.split(":")[1:]
                row = train_task(p, engine, compiled == "1", ac == "1")
            elif task == "checkpoint":
                row = checkpoint_task(p, work / "ckpt")
            elif task == "fabric":
                row = fabric_task(p, work / "fabric")
            else:
                raise ValueError(f"unknown task {task}")
            row["ok"] = True
        except Exception as e:   # noqa: BLE001 (a part that fails is a row saying why; the others go on)
            row = {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]}
        row["task"], row["wall_s"] = task, time.perf_counter() - t0
        print(MARK + json.dumps(row), flush=True)


# -- the driver side (no torch) ---------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Clock:
    """The suite's time: each part gets its own share, never more than what is left."""

    def __init__(self, budget: float) -> None:
        self.end = time.monotonic() + budget

    def left(self) -> float:
        return self.end - time.monotonic()

    def share(self, want: float) -> float:
        return max(0.0, min(want, self.left() - 5))


def run_workers(tasks: list[str], *, dry: bool, work: Path, timeout: float, env: dict[str, str]) -> list[dict[str, Any]]:
    """One worker process for ``tasks``: its rows (a part it never reached, or that overran, says so)."""
    if timeout <= 0:
        return [{"task": t, "ok": False, "error": "not run: the suite's time was spent"} for t in tasks]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--work", str(work), *(["--dry-run"] if dry else []),
           "--tasks", *tasks]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT, check=False)
        out, err, why = proc.stdout, proc.stderr, f"exit {proc.returncode}"
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err, why = "", f"timed out after {timeout:.0f}s"
    rows = [json.loads(x[len(MARK):]) for x in out.splitlines() if x.startswith(MARK)]
    done = {r["task"] for r in rows}
    tail = [x for x in err.strip().splitlines() if x.strip()][-1:] if err else []
    for t in tasks:
        if t not in done:
            rows.append({"task": t, "ok": False, "error": f"{why}{': ' + tail[0][:160] if tail else ''}"})
    return rows


def _worker_env(dry: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HIGGSFIELD_", "RANK", "WORLD_SIZE"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "TOKENIZERS_PARALLELISM": "false"})
    if dry:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _hf(project: Path, home: Path, *args: str, timeout: float) -> tuple[int, str, str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIGGSFIELD_")}
    env.update({"HIGGSFIELD_HOME_CONFIG": str(home), "PYTHONPATH": str(ROOT)})
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-m", "higgsfield", *args], cwd=project, env=env, capture_output=True,
                           text=True, timeout=max(timeout, 1), check=False)
        return r.returncode, r.stdout, r.stderr, time.perf_counter() - t0
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout:.0f}s", time.perf_counter() - t0


def cli_rows(work: Path, clock: Clock, *, dry: bool) -> list[dict[str, Any]]:
    """``higgsfield init``'s example run on localhost (process runtime), ``doctor`` and ``doctor --fabric``."""
    home = work / "home"
    home.mkdir(parents=True, exist_ok=True)
    rc, out, err, took = _hf(work, home, "init", "demo", timeout=clock.share(60))
    if rc != 0:
        return [{"task": "cli:init", "ok": False, "error": (err.strip().splitlines() or ["?"])[-1][:200],
                 "wall_s": took}]
    project = work / "demo"
    yml = project / "higgsfield.yml"
    text = yml.read_text().replace("runtime: auto", "runtime: process").replace("nproc_per_node: auto",
                                                                                 "nproc_per_node: 1")
    yml.write_text(text + f"state_dir: {work / 'state'}\n")
    rows = []
    device = "cpu" if dry else "cuda"
    steps = "5" if dry else "50"
    rc, out, err, took = _hf(project, home, "run", "example", "-p", f"steps={steps}", "-p", f"device={device}",
                             timeout=clock.share(90))
    losses = [line for line in out.splitlines() if "| step" in line]
    ok = rc == 0 and "succeeded" in err
    rows.append({"task": "cli:run", "ok": ok, "wall_s": took, "detail": f"{len(losses)} loss lines, device={device}",
                 "error": "" if ok else (err.strip().splitlines() or [f"exit {rc}"])[-1][:200]})
    rc, out, err, took = _hf(project, home, "doctor", "--json", timeout=clock.share(60))
    try:
        report = json.loads(out)
        node = report["nodes"][0]
        gpus = node["checks"].get("gpus", {})
        detail = f"GPUs: {gpus.get('summary', '?')}; " + ", ".join(
            f"{k} {'ok' if v.get('ok') else 'problem'}" for k, v in sorted(node["checks"].items()) if k != "gpus")
        rows.append({"task": "cli:doctor", "ok": True, "wall_s": took, "detail": detail[:300], "rc": rc})
    except (ValueError, KeyError, IndexError, TypeError):
        rows.append({"task": "cli:doctor", "ok": False, "wall_s": took,
                     "error": (err.strip().splitlines() or [f"exit {rc}"])[-1][:200]})
    rc, out, err, took = _hf(project, home, "doctor", "--fabric", timeout=clock.share(60))
    line = (err.strip().splitlines() or out.strip().splitlines() or [f"exit {rc}"])[-1][:200]
    rows.append({"task": "cli:fabric", "ok": rc == 0, "wall_s": took, "rc": rc,
                 "detail": line if rc == 0 else f"exit {rc}: {line}"})
    return rows


def _num(v: Any, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def table(rows: list[dict[str, Any]], *, dry: bool, device: str) -> str:
    """The suite's one Markdown table (:data:`COLUMNS`), with a line saying where and how it ran."""
    by = {r["task"]: r for r in rows}
    base = by.get("train:fsdp:0:0", {}).get("tokens_per_s")
    lines = [f"GPU suite on {device}{' (dry run: tiny model on CPU, not figures)' if dry else ''}, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]

    def add(part: str, config: str, r: dict[str, Any], **cells: str) -> None:
        result = "ok" if r.get("ok") else f"failed: {r.get('error', '?')}"
        if r.get("ok") and r.get("detail"):
            result = f"ok: {r['detail']}"
        elif not r.get("ok") and r.get("detail"):
            result = str(r["detail"])
        vals = {"tokens/s": "", "vs first": "", "MFU": "", "peak mem (GiB)": "", "seconds": "", "blocked (s)": "",
                **cells}
        row = [part, config, *(vals[c] for c in COLUMNS[2:-1]), result.replace("|", "/").replace("\n", " ")]
        lines.append("| " + " | ".join(row) + " |")

    for engine, compiled, ac in TRAIN:
        r = by.get(f"train:{engine}:{int(compiled)}:{int(ac)}", {"ok": False, "error": "not run"})
        params = r.get("params")
        size = f"{params / 1e9:.2f}B" if params and params >= 1e8 else f"{params / 1e6:.2f}M" if params else ""
        part = f"Llama {size} bf16, 1 GPU".replace("  ", " ")
        name = "FSDP2" if engine == "fsdp" else "DeepSpeed ZeRO-3"
        config = f"{name}, {'compiled' if compiled else 'eager'}, AC {'on' if ac else 'off'}"
        tps = r.get("tokens_per_s")
        add(part, config, r, **({"tokens/s": f"{tps:,.0f}", "vs first": f"{tps / base:.2f}x" if base else "n/a",
                                 "MFU": "n/a" if r.get("mfu") is None else f"{r['mfu']:.1%}",
                                 "peak mem (GiB)": _num(r.get("peak_gib"), ".1f"),
                                 "seconds": f"{r['step_s']:.3f} a step"} if r.get("ok") else {}))
    c = by.get("checkpoint", {"ok": False, "error": "not run"})
    size = f"{c['gb']:.2f} GB" if c.get("ok") else ""
    add("Checkpoint", f"save, sync ({size})", c, **({"seconds": f"{c['sync_s']:.2f}",
                                                    "blocked (s)": f"{c['sync_s']:.2f}"} if c.get("ok") else {}))
    add("Checkpoint", "save, async (3 steps while it writes)", c,
        **({"seconds": f"{c['async_s']:.2f}", "blocked (s)": f"{c['async_blocked_s']:.2f}"} if c.get("ok") else {}))
    add("Checkpoint", "load (sync save)", c, **({"seconds": f"{c['load_s']:.2f}"} if c.get("ok") else {}))
    cli = {"cli:run": ("higgsfield run", "scaffold example, localhost, process runtime"),
           "cli:doctor": ("higgsfield doctor", "localhost"), "cli:fabric": ("higgsfield doctor --fabric", "localhost")}
    for task, (part, config) in cli.items():
        r = by.get(task, by.get("cli:init", {"ok": False, "error": "not run"}))
        add(part, config, r, seconds=f"{r['wall_s']:.1f}" if "wall_s" in r else "")
    f = by.get("fabric", {"ok": False, "error": "not run"})
    detail = ""
    if f.get("ok"):
        sweep = f.get("allreduce") or [{}]
        node = (f.get("per_node") or [{}])[0]
        gpus = "; ".join(f"gpu{g['index']} {g['name']} {g['free_mib'] / 1024:.0f} GiB free, {g['health']}"
                         for g in node.get("gpus") or []) or "no GPU"
        detail = (f"{f.get('backend')}: {len(sweep)} sizes, 8 B all-reduce {sweep[0].get('time_us', 0):.0f} us; "
                  f"{gpus}; ckpt write {_num(node.get('ckpt_write_mbps'), '.0f')} MB/s")
        f = {**f, "detail": detail}
    add("fabric test worker", f"{f.get('backend', 'nccl')}, 1 rank", f,
        seconds=f"{f['wall_s']:.1f}" if "wall_s" in f else "")
    return "\n".join(lines) + "\n"


def _device_name(dry: bool) -> str:
    if dry:
        return "CPU"
    smi = shutil.which("nvidia-smi")
    if smi:
        r = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                           timeout=20, check=False)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[0]
    return "GPU (unnamed)"


def _priority(task: str) -> int:
    """The order the training parts run in on a GPU: the baseline, then compiled (the MFU target), the rest."""
    return ["train:fsdp:0:0", "train:fsdp:1:0", "train:fsdp:1:1", "train:fsdp:0:1", "train:deepspeed:0:0",
            "train:deepspeed:0:1"].index(task)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--dry-run", action="store_true", help="CPU, a tiny model, few steps: the same code paths")
    ap.add_argument("--out", type=Path, default=None, help="write the Markdown table here too")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the whole suite")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--work", default="", help=argparse.SUPPRESS)
    ap.add_argument("--tasks", nargs="*", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    dry = args.dry_run
    p = DRY if dry else GPU
    clock = Clock(args.budget)
    trains = [f"train:{e}:{int(c)}:{int(a)}" for e, c, a in TRAIN]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpu-suite-") as tmp:
        work = Path(tmp)
        # cheap parts first, so a slow compile cannot leave them unrun; the table's order is its own
        rows += cli_rows(work, clock, dry=dry)
        rows += run_workers(["fabric"], dry=dry, work=work, timeout=clock.share(p.timeouts["fabric"]),
                            env=_worker_env(dry))
        if dry:   # one worker for every torch part: seconds, not a process start each
            rows += run_workers([*trains, "checkpoint"], dry=True, work=work,
                                timeout=clock.share(p.timeouts["torch"]), env=_worker_env(True))
        else:     # a process each: an OOM or a compile crash is that part's row only
            for t in sorted(trains, key=_priority):
                _, engine, compiled, _ac = t.split(":")
                want = p.timeouts["train_compile" if compiled == "1" else
                                  "train_deepspeed" if engine == "deepspeed" else "train"]
                rows += run_workers([t], dry=False, work=work, timeout=clock.share(want), env=_worker_env(False))
            rows += run_workers(["checkpoint"], dry=False, work=work, timeout=clock.share(p.timeouts["checkpoint"]),
                                env=_worker_env(False))
    text = table(rows, dry=dry, device=_device_name(dry))
    took = ", ".join(f"{r['task']} {r['wall_s']:.0f}s" for r in rows if "wall_s" in r)
    print(f"wall time of the parts: {took}; the suite {args.budget - clock.left():.0f}s", file=sys.stderr)
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

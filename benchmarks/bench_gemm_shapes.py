"""Achieved bf16 GEMM and fused-attention rates at the shapes of a published run's layers, on this GPU.

For each GPT model of a published test set (benchmarks/published/*.toml) that ran on this GPU's kind,
the four projections of one transformer layer under its tensor-parallel degree — QKV (h → 3h/t), the
attention output (h/t → h), fc1 (h → F/t), fc2 (F/t → h) — forward (tokens × k · k × n), and the
backward's input gradient (tokens × n · n × k) and weight gradient (k × tokens · tokens × n), at
micro-batch × sequence tokens; and torch SDPA's fused causal attention forward + backward at the
model's heads per rank and head dim. The cost model's GEMM and attention rates for the `megatron`
stack on this GPU come from here (meshplan/costmodel/stacks.py).

    python benchmarks/bench_gemm_shapes.py --gpu-kind h100 --out $OUT/gemm-shapes-h100.json
    python benchmarks/bench_gemm_shapes.py --gpu-kind h100 --sustained 4 --out $OUT/gemm-shapes-h100-sustained.json

--sustained S first loads the GPU with large GEMMs for a minute (its clock settles where its power
limit holds it, as in a long training run), then times each shape over S seconds of back-to-back calls
rather than 20, and records the SM clock (nvidia-smi) beside each rate.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import tomllib
import torch
import torch.nn.functional as F

from meshplan.executor.run import median_time_s


def layer_gemms(h: int, ffn: int, t: int) -> list[tuple[str, int, int]]:
    """(name, k, n) of one layer's forward projections on one of t ranks."""
    return [("qkv", h, 3 * h // t), ("proj", h // t, h), ("fc1", h, ffn // t), ("fc2", ffn // t, h)]


SUSTAINED_S = 0.0  # seconds of back-to-back calls a shape (0: 20 calls)


def gemm_tflops(m: int, n: int, k: int) -> float:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    if SUSTAINED_S:
        return 2 * m * n * k / sustained_time_s(lambda: a @ b) / 1e12
    t = median_time_s(lambda: a @ b, reps=20, warmup=5)
    return 2 * m * n * k / t / 1e12


def sustained_time_s(fn) -> float:
    """Mean seconds a call over SUSTAINED_S seconds of back-to-back calls (batches of 50, events)."""
    import time

    fn()
    torch.cuda.synchronize()
    calls, elapsed = 0, 0.0
    start = time.perf_counter()
    while time.perf_counter() - start < SUSTAINED_S:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(50):
            fn()
        e1.record()
        e1.synchronize()
        elapsed += e0.elapsed_time(e1) / 1e3
        calls += 50
    return elapsed / calls


def sm_clock_mhz() -> float | None:
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        return float(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def heat_up(seconds: float) -> None:
    import time

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def attention_tflops(seq: int, heads: int, d: int, batch: int) -> float:
    q, k, v = (
        torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
    )
    go = torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16)

    def step():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(go)

    t = median_time_s(step, reps=10, warmup=3)
    return 4 * batch * seq * seq * heads * d * 0.5 * 3.5 / t / 1e12  # causal, forward + 2.5× backward


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu-kind", required=True, help="the [cluster] gpu of the published rows to take: h100, a100")
    ap.add_argument("--micro-batches", default="1,2")
    ap.add_argument(
        "--sustained",
        type=float,
        default=0.0,
        help="seconds of back-to-back calls a shape, after a minute of load (0: 20 calls)",
    )
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    global SUSTAINED_S
    SUSTAINED_S = args.sustained
    if SUSTAINED_S:
        heat_up(60.0)
    shapes = set()
    for path in sorted((Path(__file__).parent / "published").glob("*.toml")):
        data = tomllib.loads(path.read_text())
        for row in data.get("rows", []):
            if row.get("gpu", data.get("gpu")) != args.gpu_kind:
                continue
            h = row["hidden"]
            shapes.add((h, row.get("ffn", 4 * h), row["heads"], row["tp"], row.get("seq", data.get("seq"))))
    rows = []
    for h, ffn, heads, t, seq in sorted(shapes):
        for mbs in (int(x) for x in args.micro_batches.split(",")):
            tokens = mbs * seq
            flops = secs = 0.0
            parts = {}
            for name, k, n in layer_gemms(h, ffn, t):
                for phase, (mm, nn, kk) in (
                    ("fwd", (tokens, n, k)),
                    ("dgrad", (tokens, k, n)),
                    ("wgrad", (k, n, tokens)),
                ):
                    rate = gemm_tflops(mm, nn, kk)
                    f = 2 * mm * nn * kk
                    parts[f"{name}_{phase}"] = rate
                    flops += f
                    secs += f / (rate * 1e12)
            attn = attention_tflops(seq, heads // t, h // heads, mbs)
            rows.append(
                {
                    "hidden": h,
                    "ffn": ffn,
                    "heads": heads,
                    "tp": t,
                    "seq": seq,
                    "micro_batch": mbs,
                    "layer_gemm_tflops": flops / secs / 1e12,
                    "gemm_tflops": parts,
                    "attention_tflops": attn,
                    "sm_clock_mhz_after": sm_clock_mhz(),
                }
            )
            print(
                f"h {h:6} t {t} mbs {mbs}: layer GEMMs {flops / secs / 1e12:6.1f} TFLOP/s, "
                f"attention {attn:6.1f} TFLOP/s",
                flush=True,
            )
    sustained = f" --sustained {args.sustained:g}" if args.sustained else ""
    out = {
        "command": f"python benchmarks/bench_gemm_shapes.py --gpu-kind {args.gpu_kind}{sustained} --out {args.out}",
        "sustained_s": args.sustained,
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "summary_median_layer_gemm_tflops": statistics.median(r["layer_gemm_tflops"] for r in rows),
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

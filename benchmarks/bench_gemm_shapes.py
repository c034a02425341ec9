"""Achieved bf16 GEMM and fused-attention rates at the shapes of a published run's layers, on this GPU.

For each GPT model of a published test set (benchmarks/published/*.toml) that ran on this GPU's kind,
the four projections of one transformer layer under its tensor-parallel degree — QKV (h → 3h/t), the
attention output (h/t → h), fc1 (h → F/t), fc2 (F/t → h) — forward (tokens × k · k × n), and the
backward's input gradient (tokens × n · n × k) and weight gradient (k × tokens · tokens × n), at
micro-batch × sequence tokens; and torch SDPA's fused causal attention forward + backward at the
model's heads per rank and head dim. The cost model's GEMM and attention rates for the `megatron`
stack on this GPU come from here (meshplan/costmodel/stacks.py).

    python benchmarks/bench_gemm_shapes.py --gpu-kind h100 --out $OUT/gemm-shapes-h100.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tomllib
from pathlib import Path

import torch
import torch.nn.functional as F

from meshplan.executor.run import median_time_s


def layer_gemms(h: int, ffn: int, t: int) -> list[tuple[str, int, int]]:
    """(name, k, n) of one layer's forward projections on one of t ranks."""
    return [("qkv", h, 3 * h // t), ("proj", h // t, h), ("fc1", h, ffn // t), ("fc2", ffn // t, h)]


def gemm_tflops(m: int, n: int, k: int) -> float:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    t = median_time_s(lambda: a @ b, reps=20, warmup=5)
    return 2 * m * n * k / t / 1e12


def attention_tflops(seq: int, heads: int, d: int, batch: int) -> float:
    q, k, v = (torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    go = torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16)

    def step():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(go)

    t = median_time_s(step, reps=10, warmup=3)
    return 4 * batch * seq * seq * heads * d * 0.5 * 3.5 / t / 1e12  # causal, forward + 2.5× backward


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu-kind", required=True, help="the [cluster] gpu of the published rows to take: h100, a100")
    ap.add_argument("--micro-batches", default="1,2")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
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
                for phase, (mm, nn, kk) in (("fwd", (tokens, n, k)), ("dgrad", (tokens, k, n)),
                                             ("wgrad", (k, n, tokens))):
                    rate = gemm_tflops(mm, nn, kk)
                    f = 2 * mm * nn * kk
                    parts[f"{name}_{phase}"] = rate
                    flops += f
                    secs += f / (rate * 1e12)
            attn = attention_tflops(seq, heads // t, h // heads, mbs)
            rows.append({"hidden": h, "ffn": ffn, "heads": heads, "tp": t, "seq": seq, "micro_batch": mbs,
                         "layer_gemm_tflops": flops / secs / 1e12, "gemm_tflops": parts, "attention_tflops": attn})
            print(f"h {h:6} t {t} mbs {mbs}: layer GEMMs {flops / secs / 1e12:6.1f} TFLOP/s, "
                  f"attention {attn:6.1f} TFLOP/s", flush=True)
    out = {"command": f"python benchmarks/bench_gemm_shapes.py --gpu-kind {args.gpu_kind} --out {args.out}",
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "summary_median_layer_gemm_tflops": statistics.median(r["layer_gemm_tflops"] for r in rows),
           "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

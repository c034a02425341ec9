"""The routed experts' GEMMs as MoE training runs them: a grouped GEMM (torch._grouped_mm, bf16, what
torchtitan runs on Hopper) over a rank's local experts, against Transformer Engine's GroupedLinear
(Megatron-Core's: one cuBLAS GEMM an expert over 4 streams; forward only), one dense GEMM of the same
total rows, and a loop of one GEMM an expert on one stream.

Shapes: expert FFN projections of published MoE models (hidden → 2·ffn gate/up, ffn → hidden down, ffn
split by expert tensor parallelism where the model is run so), the local experts a rank holds at the
usual expert-parallel degrees, and 64 … 16,384 tokens an expert (balanced routing: every expert the same
rows). Forward and forward + backward (the backward's two GEMMs an expert: the input's gradient and the
weights'), TFLOP/s on 2·m·n·k a GEMM.

    python benchmarks/bench_grouped_gemm.py --out $OUT/grouped-gemm-h100.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from meshplan.executor.run import median_time_s

# (model, hidden, expert ffn, local experts): Mixtral-8x22B (ep 8: 1 an expert rank; etp 2 halves the
# ffn), Mixtral-8x22B-G8T8 (64 of 2048, ep 8: 8 a rank), Qwen2-57B-A14B (64 of 2560, ep 4: 16),
# Qwen3-30B-A3B (128 of 768, ep 8: 16), Qwen3-235B-A22B (128 of 1536, ep 32: 4; ep 8: 16),
# DeepSeek-V3 (256 of 2048, ep 64: 4; ep 8: 32).
SHAPES = [
    ("mixtral-8x22b", 6144, 16384, 1),
    ("mixtral-8x22b etp2", 6144, 8192, 1),
    ("g8t8", 6144, 2048, 8),
    ("qwen2-57b", 3584, 2560, 16),
    ("qwen3-30b", 2048, 768, 16),
    ("qwen3-235b ep32", 4096, 1536, 4),
    ("qwen3-235b ep8", 4096, 1536, 16),
    ("deepseek-v3 ep64", 7168, 2048, 4),
    ("deepseek-v3 ep8", 7168, 2048, 32),
]
TOKENS_PER_EXPERT = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
# Transformer Engine's grouped GEMM (Megatron-Core's TEGroupedLinear) is one cuBLAS GEMM an expert over
# its compute streams: "For now, we only have multi-stream cublas backend" (pytorch/csrc/extensions/
# gemm.cpp), num_compute_streams = 4 (common/util/multi_stream.h).
TE_STREAMS = 4
MAX_ROWS = 131072  # total rows a call (local experts × tokens an expert): memory and time bound


def _tflops(flops: float, seconds: float) -> float:
    return flops / seconds / 1e12


def measure(hidden: int, ffn: int, groups: int, rows: int) -> dict:
    """One expert layer's gate/up and down projections over `groups` experts of `rows` tokens each."""
    dev, dt = "cuda", torch.bfloat16
    m = groups * rows
    x = torch.randn(m, hidden, device=dev, dtype=dt, requires_grad=True)
    w1 = torch.randn(groups, 2 * ffn, hidden, device=dev, dtype=dt, requires_grad=True)
    w2 = torch.randn(groups, hidden, ffn, device=dev, dtype=dt, requires_grad=True)
    offs = torch.arange(1, groups + 1, device=dev, dtype=torch.int32) * rows
    flops = 2 * m * hidden * 3 * ffn  # gate/up (2·ffn outputs) and down

    def grouped():
        h = torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs)
        a = torch.nn.functional.silu(h[:, :ffn]) * h[:, ffn:]
        return torch._grouped_mm(a, w2.transpose(-2, -1), offs=offs)

    def looped():
        outs = []
        for g in range(groups):
            xs = x[g * rows : (g + 1) * rows]
            h = xs @ w1[g].t()
            a = torch.nn.functional.silu(h[:, :ffn]) * h[:, ffn:]
            outs.append(a @ w2[g].t())
        return torch.cat(outs)

    streams = [torch.cuda.Stream() for _ in range(TE_STREAMS)]

    def multistream():  # Transformer Engine's GroupedLinear: one cuBLAS GEMM an expert over 4 streams
        here = torch.cuda.current_stream()
        outs = [None] * groups
        for st in streams:
            st.wait_stream(here)
        for g in range(groups):
            with torch.cuda.stream(streams[g % TE_STREAMS]):
                xs = x[g * rows : (g + 1) * rows]
                h = xs @ w1[g].t()
                outs[g] = (torch.nn.functional.silu(h[:, :ffn]) * h[:, ffn:]) @ w2[g].t()
        for st in streams:
            here.wait_stream(st)
        return torch.cat(outs)

    with torch.no_grad():
        out_ms = median_time_s(multistream, reps=10, warmup=3)
    ms_fwd = {"multistream_fwd_tflops": round(_tflops(flops, out_ms), 1)}

    dense_w1 = torch.randn(2 * ffn, hidden, device=dev, dtype=dt, requires_grad=True)
    dense_w2 = torch.randn(hidden, ffn, device=dev, dtype=dt, requires_grad=True)

    def dense():
        h = x @ dense_w1.t()
        a = torch.nn.functional.silu(h[:, :ffn]) * h[:, ffn:]
        return a @ dense_w2.t()

    out = {"hidden": hidden, "ffn": ffn, "local_experts": groups, "tokens_per_expert": rows, **ms_fwd}
    for name, fn in (("grouped", grouped), ("loop", looped), ("dense", dense)):
        with torch.no_grad():
            fwd = median_time_s(fn, reps=10, warmup=3)
        grad = torch.randn(m, hidden, device=dev, dtype=dt)

        def train(fn=fn):
            fn().backward(grad)

        try:
            both = median_time_s(train, reps=6, warmup=2)
            out[f"{name}_fwd_bwd_tflops"] = round(_tflops(3 * flops, both), 1)
        except RuntimeError as err:  # a torch without _grouped_mm's backward
            out[f"{name}_fwd_bwd_error"] = str(err).splitlines()[0][:200]
        out[f"{name}_fwd_tflops"] = round(_tflops(flops, fwd), 1)
        out[f"{name}_fwd_ms"] = round(fwd * 1e3, 4)
        x.grad = w1.grad = w2.grad = dense_w1.grad = dense_w2.grad = None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = []
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, torch {torch.__version__}")
    heads = ("grouped", "loop", "dense", "g fwd", "TE fwd", "d fwd")
    print(f"{'shape':22} {'experts':>7} {'tok/exp':>7} " + " ".join(f"{h:>8}" for h in heads) + "  (TFLOP/s)")
    for name, hidden, ffn, groups in SHAPES:
        for t in TOKENS_PER_EXPERT:
            if groups * t > MAX_ROWS:
                continue
            try:
                r = measure(hidden, ffn, groups, t)
            except RuntimeError as err:
                r = {"hidden": hidden, "ffn": ffn, "local_experts": groups, "tokens_per_expert": t}
                r["error"] = str(err).splitlines()[0][:200]
            r["shape"] = name
            rows.append(r)
            cells = [r.get(f"{k}_fwd_bwd_tflops", float("nan")) for k in ("grouped", "loop", "dense")]
            cells += [r.get(f"{k}_fwd_tflops", float("nan")) for k in ("grouped", "multistream", "dense")]
            print(f"{name:22} {groups:7d} {t:7d} " + " ".join(f"{c:8.1f}" for c in cells), flush=True)
            torch.cuda.empty_cache()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": props.name, "torch": torch.__version__, "command": "python benchmarks/bench_grouped_gemm.py"}
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()

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

`--grid`: the grouped GEMMs alone (no activation between them), forward + backward, over local experts
(1 … 128) × tokens an expert (128 … 4,096) for four expert shapes, each as a fraction of one large dense
GEMM's rate timed in the same run (8192 × 4096 × 16384, forward + backward): how the grouped rate
depends on the experts a rank runs as well as on their rows.

    python benchmarks/bench_grouped_gemm.py --grid --out $OUT/grouped-gemm-grid-h100.json
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
    x, w1, w2, offs = _expert_operands(hidden, ffn, groups, rows, 2 * ffn)
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


GRID_SHAPES = [
    ("qwen3-30b", 2048, 768),
    ("qwen2-57b", 3584, 2560),
    ("deepseek-v3", 7168, 2048),
    ("mixtral-8x7b", 4096, 14336),
]
GRID_EXPERTS = [1, 4, 16, 64, 128]
GRID_TOKENS = [128, 256, 512, 1024, 2048, 4096]
GRID_MAX_WEIGHT_BYTES = 12 * 2**30  # the experts' weights and their gradients must fit beside the rows
GRID_MAX_ROWS = 262144  # 64 experts at 4,096 tokens


def _expert_operands(hidden: int, ffn: int, groups: int, rows: int, width: int) -> tuple:
    """Rows (groups·rows, hidden), [gate; up] weights (groups, width, hidden), down weights (groups,
    hidden, ffn) and the groups' ends, bf16 on the GPU, every tensor requiring its gradient."""
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(groups * rows, hidden, device=dev, dtype=dt, requires_grad=True)
    w1 = torch.randn(groups, width, hidden, device=dev, dtype=dt, requires_grad=True)
    w2 = torch.randn(groups, hidden, ffn, device=dev, dtype=dt, requires_grad=True)
    offs = torch.arange(1, groups + 1, device=dev, dtype=torch.int32) * rows
    return x, w1, w2, offs


def grid_cell(hidden: int, ffn: int, groups: int, rows: int) -> float:
    """TFLOP/s of the two grouped GEMMs of `groups` experts of `rows` tokens, forward + backward: the input
    to the down projection its own contiguous (rows, ffn) tensor (no slice of the gate/up output, whose
    backward would add a zero-fill and a copy), gradients returned by autograd.grad (none accumulated into
    .grad between repetitions)."""
    x, w1, w2, offs = _expert_operands(hidden, ffn, groups, rows, 2 * ffn)
    m = groups * rows
    a = torch.randn(m, ffn, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g1 = torch.randn(m, 2 * ffn, device="cuda", dtype=torch.bfloat16)
    g2 = torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16)

    def train():
        h = torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs)
        torch.autograd.grad(h, (x, w1), g1)
        y = torch._grouped_mm(a, w2.transpose(-2, -1), offs=offs)
        torch.autograd.grad(y, (a, w2), g2)

    seconds = median_time_s(train, reps=6, warmup=2)
    return _tflops(3 * 2 * m * hidden * 3 * ffn, seconds)


def dense_reference() -> float:
    """TFLOP/s of one large bf16 GEMM, forward + backward (8192 × 4096 by 4096 × 16384), its gradients
    returned by autograd.grad."""
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(8192, 16384, device="cuda", dtype=torch.bfloat16)
    seconds = median_time_s(lambda: torch.autograd.grad(x @ w.t(), (x, w), grad), reps=10, warmup=3)
    return _tflops(3 * 2 * 8192 * 4096 * 16384, seconds)


def table_of(cells: list[dict], experts=(16, 64)) -> list[tuple[int, float, int]]:
    """GROUPED_GEMM_FACTOR from the grid: for each tokens-an-expert, the median over the cells with
    `experts` local experts (every shape that ran them) of the fraction of the dense reference, and how
    many cells it is the median of."""
    import statistics

    rows = sorted({c["tokens_per_expert"] for c in cells})
    out = []
    for t in rows:
        vals = [c["of_dense_reference"] for c in cells if c["tokens_per_expert"] == t and c["local_experts"] in experts]
        if vals:
            out.append((t, round(statistics.median(vals), 3), len(vals)))
    return out


def grid(out: Path) -> None:
    props = torch.cuda.get_device_properties(0)
    ref = dense_reference()
    print(f"{props.name}, torch {torch.__version__}; dense reference {ref:.1f} TFLOP/s (fwd + bwd)")
    cells = []
    for name, hidden, ffn in GRID_SHAPES:
        for groups in GRID_EXPERTS:
            line = []
            for t in GRID_TOKENS:
                if groups * t > GRID_MAX_ROWS or groups * 3 * hidden * ffn * 2 * 2 > GRID_MAX_WEIGHT_BYTES:
                    continue
                tflops = grid_cell(hidden, ffn, groups, t)
                cells.append({"shape": name, "hidden": hidden, "ffn": ffn, "local_experts": groups,
                              "tokens_per_expert": t, "grouped_fwd_bwd_tflops": round(tflops, 1),
                              "of_dense_reference": round(tflops / ref, 3)})  # fmt: skip
                line.append(f"{t}:{tflops / ref:.2f}")
                torch.cuda.empty_cache()
            print(f"{name:14} E {groups:3d}  " + " ".join(line), flush=True)
    meta = {"gpu": props.name, "torch": torch.__version__, "dense_reference_tflops": round(ref, 1),
            "command": "python benchmarks/bench_grouped_gemm.py --grid"}  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    table = table_of(cells)
    out.write_text(json.dumps({"meta": meta, "cells": cells, "table": table}, indent=1) + "\n")
    print("GROUPED_GEMM_FACTOR (tokens an expert, median fraction at 16 and 64 experts, cells):", table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--grid", action="store_true", help="experts × tokens an expert, against a dense GEMM")
    args = parser.parse_args()
    if args.grid:
        grid(args.out)
        return
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

"""The executor's routed experts (meshplan.executor.experts.routed_experts): the copies laid out by expert
and one grouped GEMM a projection (torch._grouped_mm, groups padded to 8 rows) against the same layout
run one GEMM an expert (reference_grouped_mm), forward + backward in bf16 at the local-expert shapes of
the MoE validation runs, with the two paths' outputs and gradients compared.

Run (one GPU): python benchmarks/bench_experts.py --out $OUT/experts-h100.json
"""

from __future__ import annotations

import argparse
import json

import torch

from meshplan.executor.experts import reference_grouped_mm, routed_experts

# (name, hidden, expert FFN, local experts, routed rows a rank): Mixtral-8x7B and Qwen3-30B-A3B at 4K tokens
# a rank under ep = 1 and ep = 2 (top-2 and top-8 copies of 4,096 tokens).
CASES = [
    ("mixtral-8x7b ep=1", 4096, 14336, 8, 4096 * 2),
    ("mixtral-8x7b ep=2", 4096, 14336, 4, 4096 * 2),
    ("qwen3-30b-a3b ep=1", 2048, 768, 128, 4096 * 8),
    ("qwen3-30b-a3b ep=2", 2048, 768, 64, 4096 * 8),
]


def _time_ms(fn, reps: int = 10, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    rows_out = []
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    for name, h, f, experts, rows in CASES:
        torch.manual_seed(0)
        # Uneven routing: each row's expert drawn with weights around the mean, as a real router's are.
        group_of = torch.multinomial(torch.rand(experts) + 0.5, rows, replacement=True).to(dev)
        x = torch.randn(rows, h, device=dev, dtype=dt, requires_grad=True)
        w1 = (torch.randn(experts, 2 * f, h, device=dev, dtype=dt) * h**-0.5).requires_grad_()
        w2 = (torch.randn(experts, h, f, device=dev, dtype=dt) * f**-0.5).requires_grad_()
        grad = torch.randn(rows, h, device=dev, dtype=dt)
        results = {}
        paths = (
            ("grouped", lambda: routed_experts(x, group_of, experts, w1, w2)),
            ("looped", lambda: routed_experts(x, group_of, experts, w1, w2, mm=reference_grouped_mm)),
        )
        for label, fn in paths:
            out = fn()
            out.backward(grad)
            results[label] = [t.detach().float() for t in (out, x.grad, w1.grad, w2.grad)]
            x.grad = w1.grad = w2.grad = None

            def step(fn=fn):
                fn().backward(grad)

            results[label + "_ms"] = _time_ms(step)
            x.grad = w1.grad = w2.grad = None
        err = max(
            float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(results["grouped"], results["looped"])
        )
        flops = 3 * 2 * rows * h * 3 * f
        rec = {
            "case": name,
            "hidden": h,
            "ffn": f,
            "local_experts": experts,
            "rows": rows,
            "grouped_ms": results["grouped_ms"],
            "looped_ms": results["looped_ms"],
            "grouped_tflops": flops / results["grouped_ms"] / 1e9,
            "max_relative_error": err,
        }
        rows_out.append(rec)
        print(
            f"{name:20s} {experts:4d} experts {rows:6d} rows: grouped {rec['grouped_ms']:7.2f} ms "
            f"({rec['grouped_tflops']:5.0f} TFLOP/s), looped {rec['looped_ms']:7.2f} ms, rel. error {err:.2e}"
        )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(
                {
                    "command": "python benchmarks/bench_experts.py --out " + args.out,
                    "device": torch.cuda.get_device_name(0),
                    "torch": torch.__version__,
                    "cases": rows_out,
                },
                fh,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

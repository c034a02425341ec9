"""The conv of a sequence shard with packed documents (SP / TSP Mamba-2, issue #34): the Triton kernels
with the previous shard's tail and seq_idx (CausalConv1dHistoryFn) against the torch reference the
shards ran before (autograd through causal_conv1d_ref), forward and forward + backward.

    python benchmarks/bench_conv_shard.py --out $OUT/conv-shard.json        # GPU: bf16, 8K and 16K-token shards
    TRITON_INTERPRET=1 python benchmarks/bench_conv_shard.py --tiny --out /tmp/conv-shard.json  # CPU check

Each row: shard 1 of a two-shard sequence packed with 6 documents (random lengths, the shard starting
inside one, so that its tail is read), x a column slice of the in_proj output as the executor passes
it (mamba2-130m: 1,792 conv channels of 3,352; mamba2-2.7b: 5,376 of 10,576), d_conv 4. Also timed: the
Triton conv with seq_idx and no tail (CausalConv1dFn), the floor the head kernels add to. Accuracy: the
relative error (norm of the difference over the norm) of the output and of each gradient (x, tail,
weight, bias) of both paths against autograd through the reference in float64. (Under the interpreter
the kernels' bf16 stores round toward zero, not to nearest, so there Triton's output error is about
twice the reference's; on the GPU they round to nearest.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

if not torch.cuda.is_available():  # the kernels under Triton's interpreter; set before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from meshplan.executor.layouts.mamba import ShardDocs  # noqa: E402
from meshplan.executor.run import timed  # noqa: E402
from meshplan.kernels.conv1d import causal_conv1d  # noqa: E402
from meshplan.kernels.reference import causal_conv1d_ref  # noqa: E402

# (model, conv channels = d_inner + 2 · ngroups · d_state, in_proj width, where the conv's columns start)
MODELS = [("mamba2-130m", 1792, 3352, 1536), ("mamba2-2.7b", 5376, 10576, 5120)]
TINY_MODELS = [("tiny-a", 24, 60, 20), ("tiny-b", 40, 90, 30)]
DOCUMENTS = 6
D_CONV = 4


def shard_inputs(t: int, channels: int, width: int, first: int, device, dtype, seed: int):
    """Shard 1 (of two, t tokens each) of a packed sequence: (x as a slice of a wide tensor, the tail
    (b, c, K − 1) as the executor passes it, weight, bias, ShardDocs, the output gradient)."""
    gen = torch.Generator().manual_seed(seed)
    cuts = torch.randperm(2 * t - 1, generator=gen)[: DOCUMENTS - 1] + 1
    cuts = cuts[cuts != t]  # the shard starts inside a document: its tail is read
    packed = torch.zeros(1, 2 * t, dtype=torch.int64)
    for cut in cuts.tolist():
        packed[:, cut:] += 1
    docs = ShardDocs.of(packed.to(device), 1, t, D_CONV)
    wide = torch.randn(1, 2 * t, width, generator=gen).to(device=device, dtype=dtype)
    x = wide[:, t:, first : first + channels]
    tail = wide[:, t - (D_CONV - 1) : t, first : first + channels].transpose(1, 2)
    weight = (torch.randn(channels, D_CONV, generator=gen) * 0.3).to(device=device, dtype=dtype)
    bias = torch.randn(channels, generator=gen).to(device=device, dtype=dtype)
    grad = torch.randn(1, t, channels, generator=gen).to(device=device, dtype=dtype)
    return x, tail, weight, bias, docs, grad


def run_conv(conv, x, tail, weight, bias, docs, grad, backward: bool, with_tail: bool = True):
    """One forward (and backward) of `conv` as the executor calls it; returns (out, grads of x, tail,
    weight, bias) when backward, else (out,)."""
    leaves = [v.detach().requires_grad_(backward) for v in (x, tail, weight, bias)]
    kwargs = dict(initial_state=leaves[1], initial_seq_idx=docs.tail_idx) if with_tail else {}
    with torch.set_grad_enabled(backward):
        out = conv(leaves[0], leaves[2], leaves[3], seq_idx=docs.seq_idx, **kwargs)
        if not backward:
            return (out,)
        out.backward(grad)
    return (out.detach(), *(v.grad for v in leaves))


def median_s(fn, reps: int, warmup: int, cuda: bool) -> float:
    for _ in range(warmup):
        fn()
    return statistics.median(timed(fn, reps, cuda=cuda))


def rel_err(mine: torch.Tensor | None, truth: torch.Tensor | None) -> float | None:
    if mine is None or truth is None:
        return None
    return ((mine.double() - truth).norm() / truth.norm().clamp_min(1e-300)).item()


def bench_row(model, channels, width, first, t, device, dtype, reps, warmup) -> dict:
    cuda = device.type == "cuda"
    args = shard_inputs(t, channels, width, first, device, dtype, seed=t + channels)
    # Accuracy against float64 autograd through the reference (same inputs, upcast).
    exact = run_conv(causal_conv1d_ref, *(v.double() for v in args[:4]), args[4], args[5].double(), True)
    errors = {}
    for name, conv in (("triton", causal_conv1d), ("reference", causal_conv1d_ref)):
        got = run_conv(conv, *args, True)
        errors[name] = dict(zip(("out", "dx", "dtail", "dweight", "dbias"), map(rel_err, got, exact)))
    times = {}
    for name, conv, with_tail in (
        ("triton", causal_conv1d, True),
        ("reference", causal_conv1d_ref, True),
        ("triton_no_tail", causal_conv1d, False),
    ):
        for phase, backward in (("fwd", False), ("fwd_bwd", True)):
            times[f"{name}_{phase}_s"] = median_s(
                lambda: run_conv(conv, *args, backward, with_tail), reps, warmup, cuda
            )
    row = {"model": model, "channels": channels, "tokens": t, "documents": DOCUMENTS, **times}
    row["speedup_fwd_bwd"] = times["reference_fwd_bwd_s"] / times["triton_fwd_bwd_s"]
    row["rel_err_vs_fp64"] = errors
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="JSON path (default: $OUT/conv-shard.json)")
    ap.add_argument("--tiny", action="store_true", help="small shapes, a few repetitions: a CPU check that it runs")
    ap.add_argument("--reps", type=int, default=None)
    args = ap.parse_args()
    out_path = args.out or (os.path.join(os.environ["OUT"], "conv-shard.json") if os.environ.get("OUT") else None)
    if out_path is None:
        ap.error("--out PATH or $OUT is needed")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.tiny:
        ap.error("without a GPU only --tiny runs (the kernels run under Triton's interpreter)")
    dtype = torch.bfloat16
    models, tokens = (TINY_MODELS, (16, 48)) if args.tiny else (MODELS, (8192, 16384))
    reps = args.reps or (2 if args.tiny else 20)
    warmup = 1 if args.tiny else 3
    rows = []
    for t in tokens:
        for model, channels, width, first in models:
            rows.append(bench_row(model, channels, width, first, t, device, dtype, reps, warmup))
    result = {
        "command": "python " + " ".join(["benchmarks/bench_conv_shard.py", *sys.argv[1:]]),
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu (Triton interpreter)",
        "torch": torch.__version__,
        "dtype": str(dtype),
        "d_conv": D_CONV,
        "rows": rows,
    }
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{result['device']}, {dtype}, d_conv {D_CONV}, {DOCUMENTS} documents over two shards; times in ms")
    print(
        f"{'model':<12} {'tokens':>6} {'chan':>5} | {'triton fwd':>10} {'fwd+bwd':>8} | {'ref fwd':>8} "
        f"{'fwd+bwd':>8} | {'no-tail f+b':>11} | {'speedup':>7} | {'rel err triton/ref (out, dx, dtail)':<36}"
    )
    for r in rows:
        e = r["rel_err_vs_fp64"]
        errs = "/".join(f"{e['triton'][k]:.1e},{e['reference'][k]:.1e}" for k in ("out", "dx", "dtail"))
        print(
            f"{r['model']:<12} {r['tokens']:>6} {r['channels']:>5} | {r['triton_fwd_s'] * 1e3:>10.3f} "
            f"{r['triton_fwd_bwd_s'] * 1e3:>8.3f} | {r['reference_fwd_s'] * 1e3:>8.3f} "
            f"{r['reference_fwd_bwd_s'] * 1e3:>8.3f} | {r['triton_no_tail_fwd_bwd_s'] * 1e3:>11.3f} | "
            f"{r['speedup_fwd_bwd']:>6.1f}x | {errs}"
        )
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

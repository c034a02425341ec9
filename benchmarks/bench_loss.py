"""The executor's cross-entropy and TSP's logits sum on one GPU: time against the bytes they move, as a
fraction of the GPU's rated HBM rate (the cost model prices this work from bytes: compute.logits_compute,
device.TORCH_OP_HBM_FRACTION, device.LOSS_KERNEL_HBM_FRACTION).

- loss_torch: executor/layouts/vocab.py _VocabParallelCE's torch path, forward + backward (one rank's
  vocabulary, no axis), on logits (tokens × vocab) in bf16 (the head's GEMM output on a tensor axis or none)
  and fp32 (TSP's summed logits). Bytes a logit as tsp_bytes.py --cpu-paths counts its ops: the fp32 copy (read
  e, write 4), row maxima (read 4), shift and exponentials in place (read and write 4 each), sums (read 4);
  backward the softmax's division and the gradient's scaling in place (read and write 4 each) and the cast
  back (read 4, write e; none in fp32): 52 in bf16, 48 in fp32.
- loss_kernels: the same through meshplan.kernels.cross_entropy (the GPU's path), bytes by
  compute.executor_loss_bytes (14 a logit in bf16, 20 in fp32).
- tsp_sum: _TSPLogits's forward sum of D = 2 shards' bf16 products into fp32 logits (the first converted,
  read 2 write 4; the second added in, read 4 + 2 write 4) and its backward cast of the fp32 gradient to bf16
  (read 4, write 2): 22 bytes a logit.
- cat: torch.cat of two weight-sized bf16 tensors (TSP's shard packing): read and write each element.
Each at its median of --reps calls (CUDA events) after a warm-up; `rated` is the preset cluster's
hbm_tb_per_s for the GPU (--rated-tb-per-s).

    python benchmarks/bench_loss.py --rated-tb-per-s 4.8 --out $OUT/loss-h200.json
"""

from __future__ import annotations

import argparse
import json

import torch

from meshplan.costmodel.compute import executor_loss_bytes
from meshplan.executor.layouts import vocab as vocab_layout
from meshplan.executor.layouts.vocab import _VocabParallelCE
from meshplan.executor.run import median_time_s

SHAPES = ((8192, 32000), (16384, 32000), (8192, 128256))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rated-tb-per-s", type=float, required=True)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    rated = args.rated_tb_per_s * 1e12
    rows = []
    for tokens, vocab in SHAPES:
        for dtype in (torch.bfloat16, torch.float32):
            e = torch.tensor([], dtype=dtype).element_size()
            grads = []
            for kernels in (False, True):
                vocab_layout._ce_kernels = lambda t, k=kernels: k
                call = _loss_call(tokens, vocab, dtype)
                grads.append(call()[0].float())
                s = median_time_s(call, args.reps)
                logits = tokens * vocab
                nbytes = sum(executor_loss_bytes(logits, e)) if kernels else logits * torch_loss_bytes_per_logit(e)
                name = "loss_kernels" if kernels else "loss_torch"
                rows.append(_row(name, tokens, vocab, str(dtype).split(".")[-1], s, nbytes, rated))
                torch.cuda.empty_cache()
            # the kernels' gradient against the torch path's, on the same logits and labels
            rows[-1]["max_abs_grad_diff_vs_torch"] = (grads[1] - grads[0]).abs().max().item()
            del grads
        s = median_time_s(_tsp_sum_call(tokens, vocab), args.reps)
        rows.append(_row("tsp_sum", tokens, vocab, "bfloat16", s, tokens * vocab * 22, rated))
        torch.cuda.empty_cache()
    for numel in (100_663_296, 33_554_432):  # dense-7b's MLP and attention shards at tsp=2
        a, b = (torch.randn(numel // 2, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        s = median_time_s(lambda: torch.cat([a, b]), args.reps)
        rows.append(_row("cat", numel, 1, "bfloat16", s, 2 * numel * 2, rated))
    for r in rows:
        print(
            f"{r['op']:8} {r['tokens']:>10} x {r['vocab']:>6} {r['dtype']:9} {r['ms']:8.3f} ms "
            f"{r['gb']:7.2f} GB {r['fraction_of_rated']:.2f} of rated"
        )
    out = {
        "command": f"python benchmarks/bench_loss.py --rated-tb-per-s {args.rated_tb_per_s} --out $OUT/...",
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "rows": rows,
    }
    json.dump(out, open(args.out, "w"), indent=1)


def torch_loss_bytes_per_logit(e: int) -> int:
    """The torch path's bytes a logit (module docstring)."""
    return 44 + e + (0 if e == 4 else 4 + e)


def _loss_call(tokens: int, vocab: int, dtype: torch.dtype):
    """The executor's cross-entropy forward + backward on random logits (a leaf) and labels."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    labels = torch.randint(0, vocab, (tokens,), device="cuda", generator=gen)
    logits = (3 * torch.randn(tokens, vocab, device="cuda", generator=gen)).to(dtype).requires_grad_()

    def call():
        out = _VocabParallelCE.apply(logits, labels, 0, None, None)
        return torch.autograd.grad(out.sum(), logits)

    return call


def _tsp_sum_call(tokens: int, vocab: int):
    """_TSPLogits's fp32 sum of two bf16 shard products, and its backward's cast of the gradient."""
    parts = [torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    grad = torch.randn(tokens, vocab, device="cuda", dtype=torch.float32)

    def call():
        summed = parts[0].to(torch.float32)
        summed.add_(parts[1])
        return summed, grad.to(torch.bfloat16)

    return call


def _row(op, tokens, vocab, dtype, s, nbytes, rated) -> dict:
    return {
        "op": op,
        "tokens": tokens,
        "vocab": vocab,
        "dtype": dtype,
        "ms": s * 1e3,
        "gb": nbytes / 1e9,
        "fraction_of_rated": nbytes / s / rated,
    }


if __name__ == "__main__":
    main()

"""Quantized (int8) against bf16 all-reduce on the GPUs at hand, 1-256 MiB of bf16 payload, and the
end-to-end effect on TP-SSM prefill of a Mamba-2 stack.

    torchrun --nproc-per-node N benchmarks/bench_quant_allreduce.py --out $OUT/quant_allreduce.json
    NCCL_P2P_DISABLE=1 torchrun ...   # the GPUs exchange through host memory, as servers without NVLink do

Target (issue): ≥ 1.3× at ≥ 16 MiB. Times are CUDA-event medians after warm-up, one call at a time
and ten back to back; the int8 path includes its quantize / dequantize kernels
(meshplan/kernels/quant.py). The NCCL_* environment is written with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist

from meshplan.executor.comm import build_mesh, quantized_all_reduce
from meshplan.executor.run import timed
from meshplan.layout import Layout


BATCH = 10  # calls per back-to-back timing


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", timeout=timedelta(seconds=120))
    world = dist.get_world_size()
    mesh = build_mesh(Layout(tp=world))
    rows = []
    for mib in (1, 4, 16, 64, 256):
        n = mib * 2 ** 20 // 2
        x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y = torch.zeros_like(x)  # the bf16 all-reduce runs in place on it (zeros stay zeros)
        for _ in range(3):
            dist.all_reduce(y)
            quantized_all_reduce(mesh, x, "tp")
        bf16 = statistics.median(timed(lambda: dist.all_reduce(y), 20, True))
        int8 = statistics.median(timed(lambda: quantized_all_reduce(mesh, x, "tp"), 20, True))
        # Back to back, as a model's layers issue them: launch and Python time hide behind the GPU's.
        bf16_q = statistics.median(timed(lambda: [dist.all_reduce(y) for _ in range(BATCH)], 5, True)) / BATCH
        int8_q = statistics.median(timed(lambda: [quantized_all_reduce(mesh, x, "tp") for _ in range(BATCH)], 5,
                                         True)) / BATCH
        ref = x.double().clone()
        dist.all_reduce(ref)
        err = ((quantized_all_reduce(mesh, x, "tp").double() - ref).abs().max() / ref.abs().max()).item()
        rows.append({"mib_bf16": mib, "bf16_s": bf16, "int8_s": int8, "speedup": bf16 / int8,
                     "bf16_back_to_back_s": bf16_q, "int8_back_to_back_s": int8_q,
                     "speedup_back_to_back": bf16_q / int8_q, "int8_max_rel_err": err})
    e2e = end_to_end(mesh, world)
    if dist.get_rank() == 0:
        env = " ".join(f"{k}={v}" for k, v in os.environ.items() if k == "NCCL_P2P_DISABLE")
        out = {"command": f"{env} torchrun --nproc-per-node {world} benchmarks/bench_quant_allreduce.py "
                          "--out $OUT/quant_allreduce.json".strip(),
               "gpus": world, "gpu": torch.cuda.get_device_name(0),
               "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
               "allreduce": rows, "tpssm_prefill": e2e}
        json.dump(out, open(args.out, "w"), indent=1)
        for r in rows:
            print(f"{world} GPUs {r['mib_bf16']:4} MiB: bf16 {r['bf16_s'] * 1e3:7.3f} ms  int8 {r['int8_s'] * 1e3:7.3f} ms "
                  f"→ {r['speedup']:.2f}×; back to back {r['bf16_back_to_back_s'] * 1e3:7.3f} / "
                  f"{r['int8_back_to_back_s'] * 1e3:7.3f} ms → {r['speedup_back_to_back']:.2f}×  "
                  f"(max rel err {r['int8_max_rel_err']:.1e})")
        print(f"TP-SSM prefill: {e2e}")
    dist.destroy_process_group()
    return 0


def _prefill_s(model, mesh, int8: bool) -> float:
    from meshplan.executor.blocks import Stack
    from meshplan.executor.parallelize import parallelize, run_layers

    torch.manual_seed(0)
    with torch.device("cuda"):
        layers = parallelize(Stack(model, model.layers).to(torch.bfloat16), mesh, 16384, int8_allreduce=int8)
    x = torch.randn(4, 16384, model.d_model, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(2):
            run_layers(layers, x)
        return statistics.median(timed(lambda: run_layers(layers, x), 5, True))


def end_to_end(mesh, world: int) -> dict:
    """mamba2-2.7b, 4 layers, prefill of 16K tokens, batch 4: bf16 against int8 block all-reduce."""
    from meshplan.models import PRESETS

    model = replace(PRESETS["mamba2-2.7b"], layers=4)
    out = {}
    for int8 in (False, True):
        out["int8_s" if int8 else "bf16_s"] = _prefill_s(model, mesh, int8)
        torch.cuda.empty_cache()
    out["speedup"] = out["bf16_s"] / out["int8_s"]
    return out


if __name__ == "__main__":
    raise SystemExit(main())

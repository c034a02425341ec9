"""Validation sweep: every layout run for real next to the cost model's prediction, in one launch.

    torchrun --nproc-per-node 4 benchmarks/gpu_validation.py --out $OUT/validation.json
    torchrun --nproc-per-node 4 benchmarks/gpu_validation.py --smoke --out /tmp/v.json   # CPU, gloo

Each configuration runs on the first `world` ranks (1, 2 or 4); the others wait. Models are the
7B-shaped dense model and mamba2-2.7b at reduced depth (--layers), bf16. Rank 0 writes the results
after every run (a list of runs with `layout`, `model`, `seq`, `mode`, `world`, `predicted` and
`measured`), so a run that dies loses nothing before it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist

from meshplan.executor.comm import build_mesh
from meshplan.executor.run import combine_ranks, environment, measure, use_expandable_segments
from meshplan.layout import parse_layout
from meshplan.models import PRESETS, MoeSpec, dense, mamba2, moe
from meshplan.predict import predict_run
from meshplan.topologies import load_cluster

DENSE_LAYOUTS = [
    "single",
    "tp=2",
    "sp=2",
    "tsp=2",
    "dp=2",
    "dp=2,zero=1",
    "dp=2,zero=2",
    "dp=2,zero=3",
    "pp=2",
    "tp=4",
    "sp=4",
    "tsp=4",
    "tp=2,sp=2",
]
MAMBA_LAYOUTS = [
    "single",
    "tpssm=2",
    "sp=2",
    "tsp=2",
    "dp=2",
    "dp=2,zero=1",
    "dp=2,zero=2",
    "dp=2,zero=3",
    "pp=2",
    "tpssm=4",
    "sp=4",
    "tsp=4",
    "tpssm=2,sp=2",
]
# Mixtures of experts (--family moe): a coarse model (8 experts, top-2) and a fine-grained one (128, top-8).
MOE_LAYOUTS = ["single", "dp=2", "dp=2,ep=2", "dp=2,ep=2,zero=1", "dp=4,ep=4", "dp=2,tp=2,ep=2"]


def plan(args) -> list[dict]:
    if args.smoke:
        d, m = dense("smoke-dense", 64, 2, 8, 8, 256, 100), mamba2("smoke-m2", 64, 2, 100, d_state=16, headdim=16)
        dense_seqs, mamba_seqs, prefill_seqs = [64, 128], [64], [128]
    else:
        d = replace(PRESETS["dense-7b"], layers=args.layers, name=f"dense-7b/{args.layers}L")
        m = replace(PRESETS["mamba2-2.7b"], layers=args.layers, name=f"mamba2-2.7b/{args.layers}L")
        dense_seqs, mamba_seqs, prefill_seqs = [4096, 16384, 32768], [4096, 16384], [16384]
    if args.seqs:  # training at these lengths only (e.g. up to past the largest that fits)
        dense_seqs = mamba_seqs = [int(x) for x in args.seqs.split(",")]
        prefill_seqs = []
    if args.prefill_seqs:  # prefill (and the decode after it) at these lengths
        prefill_seqs = [int(x) for x in args.prefill_seqs.split(",")]
    elif args.seqs and {"prefill", "decode"} & set(args.modes.split(",")) and dist.get_rank() == 0:
        print(
            "gpu_validation: --seqs sets training lengths only; no prefill or decode runs "
            "(name their lengths with --prefill-seqs)",
            flush=True,
        )
    runs = []
    if args.family == "moe":
        moe_models = (
            [moe(dense("smoke-moe", 64, 2, 8, 8, 128, 100), MoeSpec(64, 4, 2, 32))]
            if args.smoke
            else [
                replace(PRESETS[name], layers=args.layers, name=f"{name}/{args.layers}L")
                for name in ("mixtral-8x7b", "qwen3-30b-a3b")
            ]
        )
        return [
            dict(model=model, layout=x, seq=seq, mode="train")
            for seq in (dense_seqs if args.seqs or args.smoke else [4096])
            for model in moe_models
            for x in MOE_LAYOUTS
        ]
    for seq in dense_seqs:
        runs += [dict(model=d, layout=x, seq=seq, mode="train") for x in DENSE_LAYOUTS]
    for seq in mamba_seqs:
        runs += [dict(model=m, layout=x, seq=seq, mode="train") for x in MAMBA_LAYOUTS]
    for seq in prefill_seqs:
        runs += [dict(model=d, layout=x, seq=seq, mode="prefill") for x in ("single", "pp=2", "tp=4", "tsp=4", "sp=4")]
        runs += [
            dict(model=m, layout=x, seq=seq, mode="prefill")
            for x in ("single", "tpssm=2", "sp=2", "tsp=2", "pp=2", "tpssm=4", "tsp=4")
        ]
        # Decode: one token per sequence after a prefill of `seq`, batch 8.
        runs += [
            dict(model=d, layout=x, seq=seq, mode="decode", batch=8)
            for x in ("single", "tp=2", "sp=2", "tsp=2", "pp=2", "tp=4", "tsp=4")
        ]
        runs += [
            dict(model=m, layout=x, seq=seq, mode="decode", batch=8)
            for x in ("single", "tpssm=2", "sp=2", "tsp=2", "pp=2", "tpssm=4", "tsp=4")
        ]
    return runs


def main() -> int:
    use_expandable_segments()
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--only", default="", help="layouts to run, separated by ',' (or ';' if one has a comma)")
    ap.add_argument("--profile", type=int, default=0, help="profile one more step; print this many top kernels")
    ap.add_argument(
        "--decode-conv",
        choices=["triton", "torch"],
        default="triton",
        help="Mamba-2 decode's conv step: one Triton launch or the torch ops",
    )
    ap.add_argument("--family", default="", help="dense, mamba2 or moe: run only that model family")
    ap.add_argument("--cluster", default="h200-8", help="the preset the predictions are made for")
    ap.add_argument("--modes", default="train,prefill,decode", help="comma list of modes to run")
    ap.add_argument(
        "--seqs",
        default="",
        help="comma list of training lengths replacing the grid's (and no "
        "prefill or decode runs unless --prefill-seqs names their lengths)",
    )
    ap.add_argument("--prefill-seqs", default="", help="comma list of prefill lengths (decode follows each)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--int8-allreduce", action="store_true", help="TP-SSM's block all-reduce in int8 (forward)")
    ap.add_argument("--no-exposed", action="store_true", help="skip re-timing with the transfers skipped")
    ap.add_argument(
        "--cuda-graph",
        choices=("auto", "on", "off"),
        default="auto",
        help="replay the training step as a CUDA graph (meshplan.executor.graphs): where it can be, always, never",
    )
    args = ap.parse_args()
    from meshplan.executor.layouts import mamba as mamba_layouts

    mamba_layouts.TRITON_DECODE_CONV = args.decode_conv == "triton"
    cuda = torch.cuda.is_available() and not args.smoke
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=180))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
    cluster = load_cluster(args.cluster)
    meshes: dict = {}
    results = []
    # Layouts separated by ';' when one of them has a comma ("tp=4;tp=2,sp=2"), else by ','.
    only = set(filter(None, args.only.split(";" if ";" in args.only else ",")))
    for cfg in plan(args):
        layout = parse_layout(cfg["layout"])
        if (
            layout.world_size > world
            or (only and cfg["layout"] not in only)
            or cfg["mode"] not in args.modes
            or (args.family not in ("", "moe") and cfg["model"].family != args.family)
        ):
            continue
        members = list(range(layout.world_size))
        key = str(layout)
        if key not in meshes:
            meshes[key] = build_mesh(layout, members)
        mesh = meshes[key]
        model, seq, mode, batch = cfg["model"], cfg["seq"], cfg["mode"], cfg.get("batch", 1)
        record = {
            "layout": str(layout),
            "model": model.name,
            "seq": seq,
            "batch": batch,
            "mode": mode,
            "world": layout.world_size,
            "layers": model.layers,
            "int8_allreduce": args.int8_allreduce,
        }
        mine = None
        t0 = time.time()
        if mesh is not None:
            try:
                mine = measure(
                    model,
                    layout,
                    mesh,
                    seq,
                    batch,
                    mode,
                    steps=args.steps,
                    warmup=args.warmup,
                    device=device,
                    exposed=not args.no_exposed,
                    profile=args.profile,
                    int8_allreduce=args.int8_allreduce,
                    cuda_graph=None if args.cuda_graph == "auto" else args.cuda_graph == "on",
                )
            except torch.cuda.OutOfMemoryError as exc:
                mine = {"oom": True, "error": str(exc).splitlines()[0]}
            except Exception:  # noqa: BLE001 - recorded, and the sweep goes on
                mine = {"error": traceback.format_exc()[-2000:]}
            if cuda:
                torch.cuda.empty_cache()
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if rank == 0:
            ranks = [g for g in gathered[: layout.world_size]]
            record["measured"] = combine_ranks(ranks)
            record["predicted"] = predict_run(
                replace(model, param_dtype="bf16"),
                layout,
                seq,
                batch,
                mode,
                cluster,
                int8_allreduce=args.int8_allreduce,
                launch_floor=not record["measured"].get("cuda_graph", False),  # a replayed graph: no host floor
            )
            record["per_rank"] = ranks
            record["wall_s"] = time.time() - t0
            results.append(record)
            with open(args.out, "w") as f:
                json.dump(
                    {
                        "command": f"torchrun --nproc-per-node {world} benchmarks/gpu_validation.py "
                        + " ".join(sys.argv[1:]),
                        "environment": environment(),
                        "cluster_for_predictions": cluster.name,
                        "sp_split": "zigzag",  # dense SP where meshplan.layout.sp_zigzag allows it
                        "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
                        "runs": results,
                    },
                    f,
                    indent=1,
                )
            m = record["measured"]
            p = record["predicted"]
            if "step_time_s" in m:
                print(
                    f"{record['model']:>18} {mode:7} {record['layout']:>12} s={seq:6} "
                    f"time {m['step_time_s'] * 1e3:8.2f} ms (pred {p['step_time_s'] * 1e3:8.2f}) "
                    f"peak {m['peak_bytes'] / 2**30 if m['peak_bytes'] else 0:6.2f} GiB "
                    f"(pred {p['peak_bytes'] / 2**30:6.2f}) exposed {m.get('exposed_comm_s', 0) * 1e3:7.2f} ms "
                    f"(pred {p['exposed_comm_s'] * 1e3:7.2f}) host {m.get('host_enqueue_s', 0) * 1e3:7.2f} ms",
                    flush=True,
                )
            else:
                print(f"{record['model']} {mode} {record['layout']} s={seq}: {str(m)[:300]}", flush=True)
            for name, t in (m.get("phases_s") or {}).get("top_kernels", []):
                print(f"      {t * 1e3:7.2f} ms  {name}", flush=True)
            if m.get("phases_s"):
                print(
                    "      "
                    + ", ".join(
                        f"{k} {v * 1e3:.2f} ms"
                        for k, v in m["phases_s"].items()
                        if isinstance(v, float) and k != "kernels_per_step"
                    ),
                    flush=True,
                )
                print(
                    f"      kernels per step {m['phases_s'].get('kernels_per_step')}: "
                    f"{m['phases_s'].get('kernels_by_category')}",
                    flush=True,
                )
                for i, r in enumerate(ranks):  # each rank's: GPU idle, and communication beside no compute
                    if "timeline" in (r.get("phases_s") or {}):
                        parts = r["phases_s"]["timeline"].items()
                        print(f"      rank {i} timeline " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in parts))
        dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

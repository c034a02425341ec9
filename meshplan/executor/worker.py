"""What `meshplan execute` runs on every rank under torchrun: build the layout, measure it, and
(rank 0) write one JSON file with the measurements, the prediction and the environment."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist

from meshplan.executor.comm import build_mesh
from meshplan.executor.model import tokens_from_file
from meshplan.executor.run import combine_ranks, environment, measure, use_expandable_segments
from meshplan.executor.support import executed_spec, unsupported
from meshplan.executor.torchrun import progress_line
from meshplan.hf_config import load_model
from meshplan.layout import parse_layout, validate_layout, validate_seq
from meshplan.models import first_layers
from meshplan.predict import predict_run
from meshplan.topologies.cluster import load_cluster


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="meshplan.executor.worker")
    ap.add_argument("--model", required=True)
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--layout", required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--mode", default="train", choices=("train", "prefill", "decode"))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default="", help="bf16 on cuda, fp32 on cpu by default")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument(
        "--cluster",
        default="",
        help="cluster whose GPU and links the time prediction assumes "
        "(default: the preset of the GPU the run is on, h200-8 or h100-sxm-8)",
    )
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--profile", action="store_true", help="record GPU time by kernel category (one extra step)")
    ap.add_argument("--int8-allreduce", action="store_true", help="TP-SSM: int8-quantized block all-reduce")
    ap.add_argument(
        "--layers-only", action="store_true", help="the layer stack on random hidden states, no embedding, head or loss"
    )
    ap.add_argument("--tokens", default="", help=".npy of token ids (the whole model; synthetic by default)")
    ap.add_argument("--weights", default="", help="a HF safetensors checkpoint folder (each rank reads its shard)")
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


# The cluster preset whose GPU a run's time is predicted for, by the name torch reports.
GPU_PRESETS = {"H100": "h100-sxm-8", "H200": "h200-8", "A100": "a100-sxm-8", "MI300X": "mi300x-8"}


def gpu_preset(device_name: str) -> str:
    """The preset for the GPU named `device_name` (an H200's when none matches: the GPUs the time model
    was calibrated on)."""
    return next((preset for key, preset in GPU_PRESETS.items() if key in device_name.upper()), "h200-8")


def _say(done: int, total: int, what: str, seconds: float | None) -> None:
    """Rank 0's progress, a line a finished unit of work, for the CLI's progress bar."""
    print(progress_line(done, total, what, seconds), flush=True)


def main(argv=None) -> int:
    use_expandable_segments()
    args = parse(argv)
    model = load_model(args.model)
    if args.layers:
        model = first_layers(model, args.layers)
    dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    model, dropped = executed_spec(replace(model, param_dtype=dtype))
    layout = parse_layout(args.layout)
    validate_layout(layout, model, int(os.environ.get("WORLD_SIZE", "1")))
    validate_seq(layout, args.seq, args.batch)
    whole = not args.layers_only
    if (reason := unsupported(layout, model, whole)) is not None:
        raise SystemExit(f"error: {reason}")
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", timeout=timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    mesh = build_mesh(layout)
    device = f"cuda:{torch.cuda.current_device()}" if args.device == "cuda" else "cpu"
    tokens = tokens_from_file(args.tokens, model.vocab, args.batch, args.seq) if args.tokens and whole else None
    try:
        mine = measure(
            model,
            layout,
            mesh,
            args.seq,
            args.batch,
            args.mode,
            steps=args.steps,
            device=device,
            dtype=dtype,
            exposed=args.device == "cuda",
            profile=args.profile,
            int8_allreduce=args.int8_allreduce,
            whole=whole,
            tokens=tokens,
            checkpoint=args.weights or None,
            progress=_say if rank == 0 else None,
        )
    except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:
        # Triton's kernels and NCCL report an exhausted GPU as a RuntimeError: record it as torch's is.
        if not isinstance(exc, torch.cuda.OutOfMemoryError) and "out of memory" not in str(exc).lower():
            raise
        mine = {"oom": True, "error": str(exc).strip().splitlines()[0]}
    gathered = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if rank == 0:
        cluster = (
            load_cluster(args.cluster or gpu_preset(torch.cuda.get_device_name(0))) if args.device == "cuda" else None
        )
        act = "bf16" if dtype == "bf16" else "fp32"
        run = {
            "status": "out of memory" if any(r and r.get("oom") for r in gathered) else "ok",
            "model": model.name,
            "layout": str(layout),
            "seq": args.seq,
            "batch": args.batch,
            "mode": args.mode,
            "device": args.device,
            "dtype": dtype,
            "world": layout.world_size,
            "layers": model.layers,
            "int8_allreduce": args.int8_allreduce,
            "whole_model": whole,
            "not_executed": dropped,
            "weights": args.weights or None,
            "predicted": predict_run(
                model,
                layout,
                args.seq,
                args.batch,
                args.mode,
                cluster,
                act_dtype=act,
                int8_allreduce=args.int8_allreduce,
                whole=whole,
            ),
            "measured": combine_ranks(gathered),
            "per_rank": gathered,
            "environment": environment(),
            "oom": any(r and r.get("oom") for r in gathered),
        }
        if run["oom"]:
            run["tried"] = {"layout": str(layout), "seq": args.seq, "batch": args.batch}
        with open(args.out, "w") as f:
            json.dump(run, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

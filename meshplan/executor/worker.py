"""What `meshplan execute` runs on every rank under torchrun: read the run's record (a RunSpec file,
meshplan.executor.runspec, whose path is the one argument), build the layout, measure it, and (rank 0)
write one JSON file with the measurements, the prediction and the environment."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist

from meshplan.executor.comm import build_mesh
from meshplan.executor.graphs import CaptureFailed, worker_env
from meshplan.executor.model import tokens_from_file
from meshplan.executor.run import combine_ranks, environment, measure, use_expandable_segments
from meshplan.executor.runspec import RunSpec
from meshplan.executor.support import executed_spec, unsupported
from meshplan.executor.torchrun import progress_line
from meshplan.hf_config import load_model
from meshplan.layout import parse_layout, validate_layout, validate_seq
from meshplan.models import first_layers
from meshplan.predict import predict_run
from meshplan.topologies.cluster import load_cluster

# The cluster preset whose GPU a run's time is predicted for, by the name torch reports.
GPU_PRESETS = {"H100": "h100-sxm-8", "H200": "h200-8", "A100": "a100-sxm-8", "MI300X": "mi300x-8"}


def predicted_on(cluster, named: str = "") -> dict | None:
    """Which cluster a run's times were predicted on, and whether `meshplan calibrate` measured it (a preset
    prices its links at the datasheet rate, which NCCL does not reach: 0.55-0.81 of it between two H200s,
    benchmarks/results/s26-h200x2-nccl/): `named`, the --cluster given (a profile's path), else the preset's
    name. None on the CPU, where no time is predicted."""
    if cluster is None:
        return None
    cal = cluster.calibration
    return {"cluster": named or cluster.name, "calibrated": (cal.date or "yes") if cal is not None else None}


def gpu_preset(device_name: str) -> str:
    """The preset for the GPU named `device_name` (an H200's when none matches: the GPUs the time model
    was calibrated on)."""
    return next((preset for key, preset in GPU_PRESETS.items() if key in device_name.upper()), "h200-8")


def _say(done: int, total: int, what: str, seconds: float | None) -> None:
    """Rank 0's progress, a line a finished unit of work, for the CLI's progress bar."""
    print(progress_line(done, total, what, seconds), flush=True)


def main(spec_path: str) -> int:
    use_expandable_segments()
    spec = RunSpec.read(spec_path)
    model = load_model(spec.model)
    if spec.layers:
        model = first_layers(model, spec.layers)
    dtype = spec.dtype or ("bf16" if spec.device == "cuda" else "fp32")
    model, dropped = executed_spec(replace(model, param_dtype=dtype))
    layout = parse_layout(spec.layout)
    validate_layout(layout, model, int(os.environ.get("WORLD_SIZE", "1")))
    validate_seq(layout, spec.seq, spec.batch)
    whole = not spec.layers_only
    if (reason := unsupported(layout, model, whole)) is not None:
        raise SystemExit(f"error: {reason}")
    if spec.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        os.environ.update(worker_env(layout))  # read by NCCL as it starts: TSP's rings in a CUDA graph
    dist.init_process_group("nccl" if spec.device == "cuda" else "gloo", timeout=timedelta(seconds=spec.timeout))
    rank = dist.get_rank()
    mesh = build_mesh(layout)
    device = f"cuda:{torch.cuda.current_device()}" if spec.device == "cuda" else "cpu"
    tokens = tokens_from_file(spec.tokens, model.vocab, spec.batch, spec.seq) if spec.tokens and whole else None
    try:
        mine = measure(
            model,
            layout,
            mesh,
            spec.seq,
            spec.batch,
            spec.mode,
            steps=spec.steps,
            device=device,
            dtype=dtype,
            exposed=spec.device == "cuda",
            profile=spec.profile,
            int8_allreduce=spec.int8_allreduce,
            whole=whole,
            tokens=tokens,
            checkpoint=spec.weights or None,
            progress=_say if rank == 0 else None,
            cuda_graph=spec.cuda_graph,
        )
    except CaptureFailed as exc:  # one line: why, and --no-cuda-graph
        mine = {"error": str(exc)}
    except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:
        # Triton's kernels and NCCL report an exhausted GPU as a RuntimeError: record it as torch's is.
        if not isinstance(exc, torch.cuda.OutOfMemoryError) and "out of memory" not in str(exc).lower():
            raise
        mine = {"oom": True, "error": str(exc).strip().splitlines()[0]}
    gathered = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if rank == 0:
        cluster = (
            load_cluster(spec.cluster or gpu_preset(torch.cuda.get_device_name(0))) if spec.device == "cuda" else None
        )
        act = "bf16" if dtype == "bf16" else "fp32"
        measured = combine_ranks(gathered)
        run = {
            "status": "out of memory" if any(r and r.get("oom") for r in gathered) else "ok",
            "model": model.name,
            "layout": str(layout),
            "seq": spec.seq,
            "batch": spec.batch,
            "mode": spec.mode,
            "device": spec.device,
            "dtype": dtype,
            "world": layout.world_size,
            "layers": model.layers,
            "int8_allreduce": spec.int8_allreduce,
            "whole_model": whole,
            "not_executed": dropped,
            "weights": spec.weights or None,
            "predicted": predict_run(
                model,
                layout,
                spec.seq,
                spec.batch,
                spec.mode,
                cluster,
                act_dtype=act,
                int8_allreduce=spec.int8_allreduce,
                whole=whole,
                # A replayed graph launches nothing a kernel: no host floor under the step
                launch_floor=not measured.get("cuda_graph", False),
            ),
            "predicted_on": predicted_on(cluster, spec.cluster),
            "measured": measured,
            "per_rank": gathered,
            "environment": environment(),
            "oom": any(r and r.get("oom") for r in gathered),
        }
        if run["oom"]:
            run["tried"] = {"layout": str(layout), "seq": spec.seq, "batch": spec.batch}
        with open(spec.out, "w") as f:
            json.dump(run, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))

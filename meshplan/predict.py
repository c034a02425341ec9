"""One given plan, no search: what a layout costs on a cluster under a stack, as `meshplan predict`
prints it and `benchmarks/published_runs.py` scores it; and what a run of the executor is predicted
to measure (`predict_run`), as `meshplan execute` records it beside the measurements."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from meshplan.costmodel.axes import ep, plan_context
from meshplan.costmodel.device import Device
from meshplan.costmodel.memory import (
    MemoryBreakdown,
    head_activation_bytes,
    loss_logits_bytes,
    memory_per_gpu,
    saved_activation_bytes,
)
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.pipeline import schedule_violation, validate_batch
from meshplan.costmodel.runtime import OutsideAllocator, fits_device, outside_allocator
from meshplan.costmodel.schedule import step_schedule
from meshplan.costmodel.step import StepEstimate, estimate_step, uncalibrated_group_sizes
from meshplan.errors import MeshplanError
from meshplan.layout import Layout, validate_layout, validate_seq
from meshplan.models import ModelSpec
from meshplan.topologies.cluster import ClusterSpec


@dataclass(frozen=True)
class Prediction:
    model: ModelSpec
    cluster: ClusterSpec
    layout: Layout
    seq: int
    micro_batch: int
    opts: CostOptions
    memory: MemoryBreakdown
    step: StepEstimate

    @functools.cached_property
    def outside(self) -> OutsideAllocator:
        """What the rank holds beside the allocator: the CUDA context and NCCL's buffers (priced once)."""
        return outside_allocator(self.model, self.layout, self.seq, self.opts, self.cluster.gpus_per_node)

    @property
    def fits(self) -> bool:
        return fits_device(self.memory.total_bytes, self.outside, self.cluster.gpu.memory_bytes)

    @property
    def tflops_per_gpu(self) -> float:
        """Model FLOPs a GPU achieves (MFU × peak), in TFLOP/s."""
        return self.step.mfu * self.cluster.gpu.bf16_flops_per_s / 1e12

    def as_dict(self) -> dict:
        e, o = self.step, self.opts
        return {
            "model": self.model.name,
            "cluster": self.cluster.name,
            "gpus": self.cluster.num_gpus,
            "layout": str(self.layout),
            "stack": o.stack,
            "mode": o.mode,
            "seq": self.seq,
            "micro_batch": self.micro_batch,
            "global_batch": o.global_batch or self.layout.dp * e.microbatches * self.micro_batch,
            "microbatches": e.microbatches,
            "schedule": o.schedule if self.layout.pp > 1 else None,
            "virtual_stages": o.chunks,
            "stage_layers": list(e.stage_layers),
            "chunk_layers": [list(row) for row in e.chunk_layers],
            "recompute": o.recompute,
            "tp_sequence_parallel": o.tp_sequence_parallel,
            "fits": self.fits,
            "total_bytes": self.memory.total_bytes,
            "outside_allocator_bytes": self.outside.total_bytes,
            "outside_allocator": self.outside.as_dict(),
            "gpu_memory_bytes": self.cluster.gpu.memory_bytes,
            "peak_phase": self.memory.peak_phase,
            "pipeline_stage": self.memory.pipeline_stage,
            "memory_bytes": self.memory.per_gpu_bytes,
            "step_time_s": e.step_time_s,
            "tokens_per_s": e.tokens_per_s,
            "tokens_per_step": e.tokens_per_step,
            "mfu": e.mfu,
            "hfu": e.hfu,
            "tflops_per_gpu": self.tflops_per_gpu,
            "compute_s": e.compute_s,
            "bubble_s": e.bubble_s,
            "exposed_comm_s": e.exposed_comm_s,
            "exposed_by": exposed_by(e),
            "optimizer_s": e.optimizer_s,
            "launch_wait_s": e.launch_wait_s,
            "comm_bytes_per_step": e.comm_bytes_per_step,
            "bubble_fraction": e.bubble_fraction,
            "pipeline_simulated": e.pipeline_simulated,
            "rates_note": Device.of(self.cluster, self.opts.stack_spec).rates_note,
            "uncalibrated_group_sizes": uncalibrated_sizes(
                self.model, self.cluster, self.layout, self.seq, self.micro_batch, self.opts
            ),
            "bound": e.bound,
        }


def uncalibrated_sizes(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, seq: int, micro_batch: int, opts: CostOptions
) -> list[int]:
    """The group sizes this plan's collectives run over inside a node that the cluster's calibrated profile
    did not time (step.uncalibrated_group_sizes over the plan's schedule)."""
    if cluster.calibration is None or not cluster.calibration.collectives:
        return []
    return uncalibrated_group_sizes(layout, cluster, step_schedule(model, layout, seq, micro_batch, opts))


def uncalibrated_note(sizes: list[int]) -> str:
    """One line naming the group sizes a calibrated profile timed no collective over ("" when none)."""
    if not sizes:
        return ""
    what = ", ".join(map(str, sizes))
    return (
        f"the profile timed no collective over {what} ranks: those are priced at the preset's datasheet link "
        f"rate, which NCCL does not reach (`meshplan calibrate --nproc {max(sizes)}` times them)"
    )


def exposed_by(e: StepEstimate) -> dict[str, float]:
    """A training step's exposed communication by whose collectives it is — each block kind's on the
    busiest rank ("experts": the token all-to-alls), the micro-batch's own ("microbatch": embedding,
    pipeline sends, ZeRO-3's gathers) and the gradient sync — largest first; they sum to
    exposed_comm_s. Empty outside training."""
    parts = {
        k.removeprefix("exposed_").removesuffix("_s"): v for k, v in e.breakdown.items() if k.startswith("exposed_")
    }
    if not parts:
        return {}
    parts["gradient_sync"] = e.breakdown.get("gradient_sync_exposed_s", 0.0)
    return dict(sorted(((k, v) for k, v in parts.items() if v > 0), key=lambda kv: -kv[1]))


def predict(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, seq: int, micro_batch: int, opts: CostOptions
) -> Prediction:
    """Memory and step time of one plan. Every input is checked first, each failure one line naming
    the field and the fix."""
    validate_layout(layout, model, cluster.num_gpus, cluster.name)
    validate_seq(layout, seq, micro_batch)
    validate_batch(
        model.layers,
        layout.pp,
        layout.dp,
        micro_batch,
        opts.global_batch if opts.training else 0,
        opts.chunks,
        opts.stage_layers,
        opts=opts,
        mtp_layers=model.mtp_layers,
    )
    if opts.training:
        m = opts.steps_for(layout.dp, layout.pp, micro_batch)
        violation = schedule_violation(opts.stack_spec, layout.pp, layout.zero, m, opts.chunks)
        if violation:
            raise MeshplanError(violation)
    if violation := ep.violation(model, layout, opts):
        raise MeshplanError(violation)
    ctx = plan_context(model, layout, seq, micro_batch, opts)  # checked above, sharded once
    memory = memory_per_gpu(model, layout, seq, micro_batch, opts, ctx=ctx)
    step = estimate_step(model, layout, seq, micro_batch, opts, cluster, ctx=ctx)
    return Prediction(model, cluster, layout, seq, micro_batch, opts, memory, step)


def predict_run(
    model: ModelSpec,
    layout: Layout,
    seq: int,
    batch: int,
    mode: str,
    cluster: ClusterSpec | None,
    *,
    act_dtype: str = "bf16",
    int8_allreduce: bool = False,
    sp_zigzag: bool = True,
    whole: bool = False,
    launch_floor: bool = True,
) -> dict:
    """What `meshplan execute` measures, predicted: the peak memory a GPU and its breakdown, each
    kind/axis's collective bytes a rank a step, the bytes saved for backward (train), and on a cluster
    the step time — the run file's `predicted` (meshplan.executor.worker; compared by
    meshplan.executor.compare). `sp_zigzag=False`: as for an executor that split SP contiguously
    (runs before run 36). `whole`: the whole model (embedding, head, logits and loss), not only its
    layers. `launch_floor=False`: a step replayed as a CUDA graph (executor.graphs), which the host's
    kernel launches do not floor."""
    opts = CostOptions(
        mode=mode,
        act_dtype=act_dtype,
        grad_dtype=model.param_dtype,
        int8_allreduce=int8_allreduce,
        sp_zigzag=sp_zigzag,
        launch_floor=launch_floor,
    )
    validate_layout(layout, model)
    validate_seq(layout, seq, batch)
    ctx = plan_context(model, layout, seq, batch, opts)  # sharded once for memory, bytes and time
    sh = ctx.sharding
    mem = memory_per_gpu(model, layout, seq, batch, opts, embeddings=whole, ctx=ctx)
    saved = 0.0
    if mode == "train":
        # One micro-batch through this rank's layers (a pipeline stage's share), and the head's.
        saved = saved_activation_bytes(model, layout, seq, batch, opts, layers_fraction=1 / layout.pp, sh=sh)[0]
        if whole:  # the last stage's, the fullest (a run reports its fullest rank's)
            saved += head_activation_bytes(model, sh, seq, batch, opts) + loss_logits_bytes(model, sh, seq, batch, opts)
    schedule = step_schedule(model, layout, seq, batch, opts, embeddings=whole, ctx=ctx)
    out = {
        "peak_bytes": mem.total_bytes,
        "memory_breakdown": mem.per_gpu_bytes,
        "comm_bytes": schedule.bytes_by_kind_and_axis(message=True),
        "saved_bytes": saved,
        "whole_model": whole,
        # beside the allocator (the CUDA context, NCCL's communicators): a run's outside_allocator_bytes
        "outside_allocator_bytes": outside_allocator(
            model, layout, seq, opts, cluster.gpus_per_node if cluster else layout.world_size, embeddings=whole
        ).total_bytes,
    }
    if cluster is not None:
        est = estimate_step(model, layout, seq, batch, opts, cluster, schedule=schedule, embeddings=whole, ctx=ctx)
        out.update(step_time_s=est.step_time_s, exposed_comm_s=est.exposed_comm_s, compute_s=est.compute_s)
    return out

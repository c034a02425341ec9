"""The rules every estimate obeys, checked where the numbers are made (meshplan.costmodel.step calls
these on every block and every step it prices): physics (no rate above what the stack achieves, no
negative time) and the schedules' own (a pipeline no faster than its slowest stage or one micro-batch's
trip through every stage; a step that is the sum of its parts). A violation is our bug, not the user's:
it raises InvariantError, never a silent number. tests/test_invariants.py drives them over thousands
of random plans.
"""

from __future__ import annotations

from meshplan.costmodel.blocks import BlockCompute
from meshplan.costmodel.device import ATTENTION_EFFICIENCY, Device

# Relative slack for floating-point sums of many terms.
_EPS = 1e-9


class InvariantError(AssertionError):
    """An estimate broke a rule of physics or of its schedule: a bug in the cost model."""


def best_rate(dev: Device) -> float:
    """The highest fraction of the bf16 peak any priced operation reaches on `dev`: the linear GEMMs'
    rate (FP8's under --precision fp8), the best attention rate of its tables, or decode attention's."""
    attention = [e for _, e in dev.attention_causal] + [e for _, e in dev.attention_prefix]
    return max([dev.gemm_efficiency, dev.linear_gemm_rate / dev.peak_flops, ATTENTION_EFFICIENCY] + attention)


def check_device(dev: Device) -> None:
    """No GEMM above its precision's peak: bf16 GEMMs below the bf16 peak, FP8 GEMMs below the FP8 peak."""
    if dev.gemm_efficiency > 1 + _EPS:
        raise InvariantError(f"device: bf16 GEMMs at {dev.gemm_efficiency:.3f} of the bf16 peak")
    if dev.precision != "bf16" and dev.linear_gemm_rate > dev.fp8_peak_flops * (1 + _EPS):
        raise InvariantError(
            f"device: FP8 GEMMs at {dev.linear_gemm_rate / 1e12:.0f} TFLOP/s, above the FP8 peak "
            f"{dev.fp8_peak_flops / 1e12:.0f}"
        )


def check_block(kind: str, comp: BlockCompute, dev: Device) -> None:
    """A block's forward takes at least its FLOPs at the best achieved rate, and no part is negative;
    the device prices no GEMM above its precision's peak."""
    check_device(dev)
    parts = {
        "gemm": comp.gemm_fwd_s,
        "attention": comp.attn_fwd_s,
        "memory-bound": comp.mem_fwd_s,
        "recompute": comp.recompute_fwd_s,
        "kernels": comp.kernel_fwd_s,
        "kernels backward": comp.kernel_bwd_s,
        "shard motion": comp.motion_fwd_s,
        "shard motion backward": comp.motion_bwd_s,
    }
    for name, value in parts.items():
        if value < 0:
            raise InvariantError(f"{kind} block: {name} time is negative ({value:.3e} s)")
    floor = comp.flops_fwd / (dev.peak_flops * best_rate(dev))
    if comp.fwd_s < floor * (1 - _EPS):
        raise InvariantError(
            f"{kind} block: forward {comp.fwd_s:.3e} s is below its {comp.flops_fwd:.3e} FLOPs at the best "
            f"achieved rate ({floor:.3e} s)"
        )


def check_passes(stage_s: list[float], microbatches: int, total_s: float, busy_s: float) -> None:
    """A pipeline's passes take at least the busiest stage's m micro-batches, and at least one
    micro-batch's trip forward and back through every stage."""
    floor = max(microbatches * max(stage_s), sum(stage_s))
    if total_s < floor * (1 - _EPS):
        raise InvariantError(f"pipeline: passes of {total_s:.6e} s beat the schedule's bound of {floor:.6e} s")
    if busy_s > total_s * (1 + _EPS):
        raise InvariantError(f"pipeline: the busiest stage computes {busy_s:.6e} s inside passes of {total_s:.6e} s")


def check_step(est, dev: Device, *, world_size: int, hardware_flops: float, model_flops: float) -> None:
    """A step estimate: every part >= 0, the parts sum to the step, exposed communication no more than
    all of it, no FLOP rate above the stack's best (HFU), MFU <= HFU, and a label that names the
    largest part."""
    parts = {
        "compute_s": est.compute_s,
        "bubble_s": est.bubble_s,
        "exposed_comm_s": est.exposed_comm_s,
        "optimizer_s": est.optimizer_s,
        "launch_wait_s": est.launch_wait_s,
    }
    step = est.step_time_s
    tol = _EPS * max(step, 1e-30)
    for name, value in parts.items():
        if value < -tol:
            raise InvariantError(f"step: {name} is negative ({value:.3e} s)")
    for name, value in est.breakdown.items():
        if name.endswith("_s") and value < -tol:
            raise InvariantError(f"step: breakdown {name} is negative ({value:.3e} s)")
    if abs(sum(parts.values()) - step) > 1e-6 * step:
        raise InvariantError(f"step: {step:.6e} s is not the sum of its parts {parts}")
    if est.exposed_comm_s > est.comm_s * (1 + 1e-6) + tol:
        raise InvariantError(
            f"step: exposed communication {est.exposed_comm_s:.3e} s exceeds all of it ({est.comm_s:.3e} s)"
        )
    if step > 0:
        hfu = hardware_flops / (step * world_size * dev.peak_flops)
        if hfu > best_rate(dev) * (1 + 1e-6):
            raise InvariantError(f"step: HFU {hfu:.3f} above the stack's best achieved rate {best_rate(dev):.3f}")
        if model_flops > hardware_flops * (1 + 1e-9):
            raise InvariantError("step: model FLOPs exceed hardware FLOPs")

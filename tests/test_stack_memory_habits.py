"""#33, the stacks' memory habits: pipeline-stage outputs freed after send, FSDP's per-unit gradient
reduce-scatter, and Llama 3's FSDP + PP stack (arXiv 2407.21783 §3.3.2), pinned on the 405B at 8K."""

import pytest

from meshplan.costmodel.axes import sharding_for
from meshplan.costmodel.memory import boundary_activation_bytes, memory_per_gpu
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.pipeline import schedule_violation
from meshplan.costmodel.stacks import STACKS
from meshplan.layout import Layout
from meshplan.models import dense
from meshplan.topologies.cluster import load_cluster

GIB = 2**30
# Llama-3.1-405B's shape (meta-llama/Llama-3.1-405B config.json)
L405 = dense("llama3.1-405b", 16384, 126, 128, 8, 53248, 128256)
# Table 4 of the paper: 16,384 GPUs, TP 8, CP 1, PP 16, DP 128, 8K sequences, 32 sequences a DP rank
LAYOUT_Z1 = Layout(dp=128, tp=8, pp=16, zero=1)
LAYOUT_Z2 = Layout(dp=128, tp=8, pp=16, zero=2)
SEQ, HIDDEN = 8192, 16384
# One layer: Q and O (h × h each), K and V (h × 8 heads · 128), gate, up, down (h × 53248), two norms
LAYER = 2 * HIDDEN**2 + 2 * HIDDEN * 1024 + 3 * HIDDEN * 53248 + 2 * HIDDEN
# Stage 1 (the fullest: 8 layers, 15 micro-batches in flight), split 8 ways but for its norm scales
STAGE_PARAMS = 8 * ((LAYER - 2 * HIDDEN) / 8 + 2 * HIDDEN)
H100_BYTES = load_cluster("h100-sxm-8").gpu.memory_bytes


def _opts(stack: str) -> CostOptions:
    return CostOptions(stack=stack, global_batch=128 * 32, tp_sequence_parallel=True, grad_dtype="fp32")


def _mem(stack: str, layout: Layout):
    return memory_per_gpu(L405, layout, SEQ, 1, _opts(stack))


def test_405b_at_8k_fits_an_h100_under_llama3_without_recompute():
    mem = _mem("llama3", LAYOUT_Z2)
    peak = mem.at_peak_bytes
    assert (mem.pipeline_stage, mem.peak_phase) == ("stage 1", "layer")
    assert peak["parameters"] == pytest.approx(STAGE_PARAMS * 2, rel=1e-6)  # bf16, kept whole (no reshard)
    assert peak["gradients"] == pytest.approx(STAGE_PARAMS * 4 / 128, abs=2**20)  # fp32, sharded over dp
    assert peak["optimizer_state"] == pytest.approx(STAGE_PARAMS * 12 / 128, rel=1e-6)
    # One layer's bf16 gradients and their fp32 reduce-scatter input, 6 B a parameter of a rank's eighth
    assert peak["transient_comm_buffers"] == pytest.approx(L405.layer_params() / 126 / 8 * 6, rel=1e-9)
    # Breakdown: parameters 5.94, gradients 0.09, optimizer 0.28, activations 60.79, comm 2.23 GiB
    assert mem.total_bytes / GIB == pytest.approx(69.58, abs=0.01)
    assert mem.total_bytes < H100_BYTES


def test_stage_outputs_freed_after_send_leave_the_gradient_received():
    sh = sharding_for(LAYOUT_Z1, _opts("megatron"))
    one = SEQ * HIDDEN * 2  # a stage output in bf16 (the model sends whole tokens here)
    for stack in ("megatron", "megatron-2021", "llama3"):
        assert boundary_activation_bytes(L405, sh, SEQ, 1, _opts(stack), 15) == one
    for stack in ("meshplan", "deepspeed"):  # the executor and DeepSpeed's PipelineEngine keep them
        assert boundary_activation_bytes(L405, sh, SEQ, 1, _opts(stack), 15) == 16 * one
    kept = memory_per_gpu(L405, LAYOUT_Z1, SEQ, 1, _opts("deepspeed")).at_peak_bytes["activations"]
    freed = _mem("megatron", LAYOUT_Z1).at_peak_bytes["activations"]
    assert kept - freed == pytest.approx(15 * one, rel=1e-9)


def test_405b_under_megatron_zero1_keeps_its_fp32_gradient_buffer():
    mem = _mem("megatron", LAYOUT_Z1)
    assert mem.at_peak_bytes["gradients"] == pytest.approx(STAGE_PARAMS * 4, abs=2**20)  # 11.88 GiB, unsharded
    assert mem.at_peak_bytes["transient_comm_buffers"] == 0
    # 82.89 GiB before the outputs were freed; 3.75 GiB (15 outputs of 256 MiB) less now: 0.5 GiB to spare
    assert mem.total_bytes / GIB == pytest.approx(79.14, abs=0.01)
    assert mem.total_bytes < H100_BYTES


def test_llama3_runs_zero2_under_pipelining_and_megatron_does_not():
    llama3, megatron = STACKS["llama3"], STACKS["megatron"]
    assert schedule_violation(llama3, 16, 2, 32, 1) is None
    assert schedule_violation(llama3, 16, 2, 32, 2) is None  # interleaved, 32 micro-batches in groups of 16
    assert "ZeRO up to stage 2 with pipeline" in schedule_violation(llama3, 16, 3, 32, 1)
    assert "ZeRO up to stage 1 with pipeline" in schedule_violation(megatron, 16, 2, 32, 1)


def test_the_executors_adam_step_holds_no_fp32_temporaries():
    """meshplan's executor steps each parameter as one kernel (meshplan/kernels/adam.py) that reads the bf16
    gradient where it lies and writes the bf16 weight in place: at the optimizer's moment the rank holds
    its gradients and nothing transient. Megatron's count adds two fp32 copies of its largest matrix, one
    expert's [gate; up] (hand count: 2 × 4 B × 2f · h). Mixtral-8x7B's 2 layers at dp=2, ep=2, 256 tokens:
    the gradients of both layers outweigh one layer's activations, so the step sets the peak."""
    from dataclasses import replace

    from meshplan.layout import parse_layout
    from meshplan.models import PRESETS

    mixtral = replace(PRESETS["mixtral-8x7b"], layers=2)
    m = mixtral.moe
    layout = parse_layout("dp=2,ep=2")
    mine = memory_per_gpu(mixtral, layout, 256, 1, CostOptions(stack="meshplan"))
    theirs = memory_per_gpu(mixtral, layout, 256, 1, CostOptions(stack="megatron"))
    assert mine.peak_phase == theirs.peak_phase == "optimizer"
    assert mine.at_peak_bytes["transient_working"] == 0
    assert mine.at_peak_bytes["gradients"] == mine.per_gpu_bytes["gradients"]
    assert theirs.at_peak_bytes["transient_working"] == pytest.approx(2 * 4 * 2 * m.expert_ffn * m.hidden)
    assert theirs.total_bytes - mine.total_bytes == pytest.approx(2 * 4 * 2 * m.expert_ffn * m.hidden, abs=2)


def test_the_executors_adam_step_moves_28_bytes_a_parameter():
    """The optimizer step's time is the rank's kept states over HBM at the stack's bytes a parameter:
    28 for meshplan's one-kernel step (read the bf16 gradient 2, fp32 weight, m, v 12; write them 12 and
    the bf16 weight 2) at the copy rate it was measured at (0.86 of HBM), 40 for torch's casts around its
    fused AdamW at the HBM rate, which the other stacks are priced at. A dense 2-layer model on one GPU keeps
    every parameter's states."""
    from meshplan.costmodel.device import Device
    from meshplan.costmodel.memory import local_params
    from meshplan.costmodel.step import estimate_step

    model = dense("tiny-2l", 2048, 2, 16, 8, 5632, 32000)
    cluster = load_cluster("h200-8")
    kept = local_params(model, sharding_for(Layout(), CostOptions()))
    assert STACKS["meshplan"].optimizer_step_bytes_per_param == 28
    assert {s.optimizer_step_bytes_per_param for name, s in STACKS.items() if name != "meshplan"} == {40}
    for stack, nbytes, fraction in (("meshplan", 28, 0.86), ("megatron", 40, 1.0)):
        opts = CostOptions(stack=stack, global_batch=1)
        est = estimate_step(model, Layout(), 4096, 1, opts, cluster)
        rate = Device.of(cluster, opts.stack_spec).hbm_bytes_per_s * fraction
        assert est.optimizer_s == pytest.approx(kept * nbytes / rate)

"""The eager executor's kernel launches per block invocation, measured (the launch floor's count: the
host's time a kernel is meshplan.costmodel.device.STEP_KERNEL_HOST_S, whose comment gives the
profiles), and what a layout's axes add to them."""

from __future__ import annotations

# A decode step's kernels are tiny, and the GPU spends time on each beyond its bytes: idle between one
# dependent kernel and the next, and a small kernel's floor. In the same profile the step took 3.163 ms
# for 92 kernels: 2.340 ms in the attention gemvs (priced above), 0.283 ms in the other GEMMs and 0.255
# ms in elementwise kernels, where the model puts 0.224 and 0.002 ms, and 0.285 ms idle — 0.595 ms more
# than the model's work, 6.4 µs a kernel. Charged per launched kernel of a decode step (the launch
# floor's count), on top of the GPU work; checked on runs 53-55
# (benchmarks/results/validation-h200-run5{3,4,5}-*.json), which were not used to set it: dense decode at one GPU
# 3.14-3.31 ms measured.
DECODE_KERNEL_GPU_S = 6.4e-6


# A mixture-of-experts layer in training (router and experts; only their sum is measured, put on the
# experts): 370 kernels a 2-layer Mixtral step on one GPU, the same on an H100 and on two H200 machines
# (benchmarks/results/s22-h200x4/profile-moe-h200x4-s22.json, validation-moe-h200x2-s20-single-profile.json,
# validation-moe-h100-s20-qknorm-single-profile.json: `phases_s.kernels_per_step`), less two attention
# blocks' 41.9: 143.1 a layer — the eager routing's sort, counts, gathers and scatter-adds around the
# grouped GEMMs, whose number does not grow with the experts. Qwen3-MoE's step launches 404 (its q/k
# norms' kernels, 17 a layer, not counted here: its floor is that much low).
STEP_KERNELS_PER_BLOCK = {
    "train": {"attention": 41.9, "mlp": 41.9, "mamba2": 106.5, "router": 0.0, "experts": 143.1},
    # (a mixture of experts' prefill and decode were not profiled: the layer counts as one MLP block)
    "prefill": {"attention": 10.0, "mlp": 10.0, "mamba2": 23.0, "router": 0.0},
    "decode": {"attention": 16.0, "mlp": 16.0, "mamba2": 32.0, "router": 0.0},
}


# What sharding adds per block, from the same runs (degree 2): TP-SSM's collectives and their copies;
# a sequence split — for Mamba-2 the shard's conv tail, the all-gather of the shards' summaries and the
# correction for the entering state (forward, recomputed forward, their backward): 126 in training,
# from 465 kernels a 2-layer SP step at 16K and 128K
# (benchmarks/results/validation-h200-run64-x2-mamba2-sp-correction-cat.json, `kernels_per_step`) less one GPU's 213,
# a block; 23 in prefill (92 a 2-layer
# step, less twice the 23 above). With the correction as torch ops it was 142 and 30
# (profile-sp-mamba2-128k-conv-head-h200x2.json; validation-h200-run4{0,1}-x2-mamba2-sp-one-scan.json);
# TSP's Mamba-2 block (the ring's hops, the gathered weights' unpacking, SP's shard steps, the gradients'
# packing): 137 in training, 35 in prefill, 10 in decode at degree 2 (487, 116 and 84 kernels a 2-layer
# step, less the counts above: validation-h200-run67-x2-mamba2-tsp.json),
# for a dense layer the K/V exchange (decode: each rank's partial attention and their combination) —;
# and TSP's shard-by-shard loops, taken as growing with the degree (each ring step runs one attention
# call and one weight shard). TP leaves a dense training layer within 2% of one GPU's count (82.5
# against 83.8); in decode it adds one launch a layer. Dense prefill under SP or TSP was not profiled:
# nothing is added there, so the floor is a lower bound.
STEP_KERNELS_SHARDED = {
    "train": {
        # Expert parallelism's all-to-alls (dispatch and combine, their size exchanges, forward and
        # backward): 20 communication kernels a 2-layer Mixtral step at ep = 2 and at ep = 4, 24 for
        # Qwen3-MoE; a tensor axis under ep 8 (Mixtral) and 9 (Qwen3) more (the same profiles, 2-4 × H200).
        # What dp and ep add to the optimizer's kernels (gradients bucketed and reduced over dp and edp:
        # 20-72 a step over the single GPU's 14-18) depends on the split and is not counted.
        "experts": {"ep": 10.0, "ep+tp": 4.0},
        "mamba2": {"tpssm": 6.5, "sp": 126.0, "tsp2": 137.0},
        "attention": {"sp": 12.3, "tsp2": 117.0},
        "mlp": {"sp": 12.3, "tsp2": 117.0},
    },
    "prefill": {"mamba2": {"tpssm": 2.0, "sp": 23.0, "tsp2": 35.0}},
    "decode": {
        "mamba2": {"tpssm": 1.0, "tsp2": 10.0},
        "attention": {"tp": 0.5, "sp": 4.5, "tsp2": 33.0},
        "mlp": {"tp": 0.5, "sp": 4.5, "tsp2": 33.0},
    },
}


def step_kernels_per_block(kind: str, mode: str, layout) -> float:
    """Kernels the eager executor launches for one invocation of a `kind` block in a training,
    prefill or decode step under `layout` (STEP_KERNELS_PER_BLOCK and STEP_KERNELS_SHARDED)."""
    base = STEP_KERNELS_PER_BLOCK[mode]
    known = kind if kind in base else "mlp"
    extra = STEP_KERNELS_SHARDED[mode].get(known, {})
    n = base[known]
    if layout.tp > 1:
        n += extra.get("tp", 0.0)
    if layout.ep > 1:
        n += extra.get("ep", 0.0) + (extra.get("ep+tp", 0.0) if layout.tp > 1 else 0.0)
    if layout.tpssm > 1:
        n += extra.get("tpssm", 0.0)
    if layout.sp > 1:
        n += extra.get("sp", 0.0)
    if layout.tsp > 1 and known == "mamba2":
        # Measured at degree 2; each rank more adds a ring hop each way (its send/recv and the copy into
        # the gathered rows: meshplan/executor/layouts/tsp_mamba.py ring_gather) and a row of packed
        # gradients — the rest (SP's shard steps, the unpacking) does not grow with the degree.
        n += extra.get("tsp2", 0.0) + TSP_MAMBA_KERNELS_PER_RANK[mode] * (layout.tsp - 2)
    elif layout.tsp > 1:
        n += extra.get("tsp2", 0.0) * layout.tsp / 2
    return n


TSP_MAMBA_KERNELS_PER_RANK = {"train": 5.0, "prefill": 2.0, "decode": 2.0}

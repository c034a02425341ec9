"""Attention blocks: QKV and output projections around a causal attention core — fused (SDPA's flash
or cuDNN kernel, at the device's measured rate by key length) or unfused (Megatron's batched GEMMs around
a fused softmax); on sequence shards each rank attends its queries over the gathered keys (zigzag: the
slowest rank of two prefix attentions); a decode step reads the local KV cache once.

Multi-head latent attention (MLA, DeepSeek-V2/V3; models.AttentionSpec) is priced as Megatron-Core runs
it (megatron/core/transformer/multi_latent_attention.py, MLASelfAttention): the down-projections to the
query and K/V latents, and the latents' norms, whole on every tensor rank; the up-projections (q_b,
kv_b) column-parallel and the output projection row-parallel, split by heads; the core over query/key
heads of nope + rope and value heads of v_head_dim. Training saves the up-projected K and V; inference
caches the K/V latent and the shared rope key only, and decode attends over it with the up-projections
absorbed (DeepSeek-V2 report §2.1.2).
"""

from __future__ import annotations

from meshplan.costmodel.activations import FP32, MASK, NORM_STATS, Saved
from meshplan.costmodel.blocks.base import ATTENTION_BWD_FACTOR, BlockCompute, BlockKind, selective_modules
from meshplan.costmodel.device import (
    ATTENTION_EFFICIENCY,
    TORCH_OP_HBM_FRACTION,
    ZIGZAG_MOTION_HBM_FRACTION,
    Device,
    _efficiency_table,
    attention_efficiency,
)
from meshplan.costmodel.options import MemoryOptions
from meshplan.models import ModelSpec

# Unfused attention saves its scores and probabilities, so its backward recomputes nothing: the two batched
# GEMMs' input and weight-side gradients (4 matmuls to forward's 2) and the softmax and dropout gradients,
# which read and write about as many score bytes as their forward (Narayanan et al. 2021 §4.2's kernels).
UNFUSED_ATTENTION_BWD_FACTOR = 2.0


# Decode, measured on an H200 at batch 8 after a 16K prefill (2 layers, one GPU;
# benchmarks/results/decode-profile-h200.json, `torchrun --nproc-per-node 1 benchmarks/gpu_validation.py --modes decode
# --only single --profile 3 --steps 20`): torch's attention over the KV cache runs as two cuBLAS gemv
# kernels (q·Kᵀ, then ·V) reading 4.29 GB in 2.34 ms, 1.84e12 B/s — 0.38 of the datasheet HBM rate.
DECODE_ATTENTION_HBM_FRACTION = 0.38


def zigzag_attention_s(q_width: float, tokens: float, keys: float, parts: int, dev: Device) -> float:
    """Seconds of the slowest rank's attention forward under a zigzag split of each sequence of `keys`
    tokens over `parts` ranks, for the rank's `tokens` local queries (keys / parts of each sequence, so
    tokens·parts/keys sequences): on each sequence a rank runs two prefix attentions of keys/2D queries,
    over (i+1)·c and (2D−i)·c keys (c = keys / 2D), at the prefix kernel's rate for that many keys —
    shorter prefixes run at a lower rate, so the balanced FLOPs do not take balanced time. Attention is
    per sequence: the time is linear in the sequences a micro-batch holds."""
    import numpy as np  # here, not at the top: importing the planner loads no numpy

    c = keys / (2 * parts)
    q = c  # each half-shard holds keys / 2D queries of one sequence
    sequences = tokens * parts / keys
    i = np.arange(parts)
    ends = np.concatenate([(i + 1) * c, (2 * parts - i) * c])  # each rank's two prefixes, rank by rank
    # attention_efficiency at every end at once (np.interp clamps at the table's ends as it does): the
    # planner meets splits over thousands of ranks, where a loop of scalar calls took most of its time.
    table = _efficiency_table(True, dev)
    eff = np.interp(np.log(ends), np.log([k for k, _ in table]), [e for _, e in table])
    # q queries, the last q of `end` positions, lower-right causal
    t = 4 * q_width * (q * ends - q * q / 2) / (dev.peak_flops * eff)
    return sequences * float((t[:parts] + t[parts:]).max())


def zigzag_motion_bytes(tokens: float, parts: int, q_width: float, kv_width: float, e: int) -> tuple[float, float]:
    """(forward, backward) bytes the executor's zigzag sequence shard moves around its attention kernels,
    for the busiest rank's `tokens` local queries over `parts` shards (meshplan.executor.layouts.common
    .attend_zigzag, reorder path): G = the gathered K (or V) — tokens · parts · kv_width · e — and L = the
    rank's queries and output, tokens · q_width · e. Forward: K and V put in position order (index_select,
    read and written: 4G), the two blocks' outputs of each query chunk lifted to fp32, merged by their
    log-sum-exps and cast back (9L and 6L), the chunks' outputs concatenated (2L). Backward: the two chunks'
    K and V gradients summed (6G) and each chunk's two query gradients (3L) and the slices' (3L); each
    chunk's off-diagonal and diagonal key gradients concatenated, over (2·parts + 1)/(2·parts) of the
    sequence's keys (4G of that); the key slices' gradients zero-filled to the whole sequence and their
    keys copied in (2G(2 + (2·parts + 1)/(2·parts)) on a rank past the first, whose second chunk sees
    fewer than every key), the query slices' (3L); the reorder's inverse (4G). As benchmarks/zigzag_bytes.py
    counts them (each op's tensor arguments read and its outputs written; tests hold the two equal), no
    recompute; the attention kernels' own traffic is core_s's."""
    gathered = tokens * parts * kv_width * e
    local = tokens * q_width * e
    reach = (2 * parts + 1) / (2 * parts)  # the keys a rank's two chunks see, over one sequence's
    forward = 4 * gathered + 17 * local
    backward = (6 + 4 * reach + 2 * (2 + reach) + 4) * gathered + 9 * local
    return forward, backward


# Megatron-LM's core attention without a fused kernel (Narayanan et al. 2021 §4.2: baddbmm for QKᵀ,
# a fused scale-mask-softmax, dropout, bmm for PV): the full s × s scores of every head are computed and
# then masked, and cross HBM as fp16 — written by QKᵀ (2 B), read and written by the softmax (4 B), by
# dropout with its 1-byte mask (5 B), read by PV (2 B): 13 bytes a score forward.
UNFUSED_SCORE_BYTES = 13


def unfused_attention_s(model: ModelSpec, tokens: float, keys: float, head_div: int, e: int, dev: Device) -> float:
    """Forward seconds of unfused attention over all `keys` (no causal saving): its two batched GEMMs at
    the GEMM rate and the scores' HBM traffic (UNFUSED_SCORE_BYTES)."""
    a = model.attention
    flops = 4 * tokens * keys * a.core_width / head_div
    scores = tokens * keys * a.heads / head_div
    return flops / (dev.peak_flops * dev.gemm_efficiency) + scores * UNFUSED_SCORE_BYTES * e / 2 / dev.rated_hbm


def attention_saved(model: ModelSpec, opts: MemoryOptions) -> list[Saved]:
    attn = model.attention
    e = opts.nbytes("act_dtype")
    # A GEMM input saved for the weight gradient: in FP8 under --precision fp8 (TE's LayerNormLinear saves
    # its quantized norm output, TE's Linear its quantized input: opts.gemm_input_bytes)
    gemm_in = opts.gemm_input_bytes
    items = [
        Saved("attn_norm_input", e * attn.hidden, "hidden"),
        Saved("attn_norm_stats", NORM_STATS[model.norm], "hidden"),
        Saved("qkv_input", gemm_in * attn.hidden, "hidden"),
    ]
    if attn.mla:
        items += mla_latents_saved(attn, e)
    items += [
        Saved("q", e * attn.q_width, "heads"),
        Saved("k", e * attn.kv_width, "heads"),
        Saved("v", e * attn.value_width, "heads"),
    ]
    if attn.qk_norm:
        items += qk_norms_saved(attn, e)
    items += [
        # The attention output is the out-projection's input; fused kernels save it once for both.
        Saved("attn_out", e * attn.out_width, "heads"),
    ]
    if opts.precision != "bf16":
        # ... but under FP8 the core keeps its bf16 output and the out-projection its own FP8 copy.
        items.append(Saved("proj_input_fp8", gemm_in * attn.out_width, "heads"))
    if opts.flash_attention:
        items.append(Saved("attn_logsumexp", FP32 * attn.heads, "heads"))
    else:
        # softmax output (a·s² per sequence), and with dropout its mask and the dropped-out copy.
        items.append(Saved("attn_softmax", e * attn.heads, "heads", quadratic=True, recomputed_by_selective=True))
        if attn.kv_heads < attn.heads:
            # GQA without a fused kernel: K and V are repeated to every query head before the matmuls.
            items.append(Saved("k_repeated", e * attn.q_width, "heads", recomputed_by_selective=True))
            items.append(Saved("v_repeated", e * attn.q_width, "heads", recomputed_by_selective=True))
        if opts.dropout:
            items.append(
                Saved(
                    "attn_softmax_dropout_mask",
                    MASK * attn.heads,
                    "heads",
                    quadratic=True,
                    recomputed_by_selective=True,
                )
            )
            items.append(
                Saved("attn_softmax_dropout_out", e * attn.heads, "heads", quadratic=True, recomputed_by_selective=True)
            )
    if opts.dropout:
        items.append(Saved("attn_dropout_mask", MASK * attn.out_hidden, "hidden"))
    return items


def qk_norms_saved(attn, e: int) -> list[Saved]:
    """The query and key norms (Qwen3's per head, OLMo2's over the whole widths) between the projection
    and the rotary: each keeps its input — the projection's q and k, counted above — and its fp32 rstd,
    and writes a new q and k, which the core keeps (meshplan/executor/blocks.py qkv_heads; TE's norms
    in Megatron-Core's attention keep theirs alike). The executor's Triton norm (GPU) keeps no rstd:
    the statistics are its CPU path's, as attn_norm_stats are."""
    rows = attn.heads + attn.kv_heads if attn.qk_norm == 2 * attn.head_dim else 2
    return [
        Saved("qk_normed", e * (attn.q_width + attn.kv_width), "heads"),
        Saved("qk_norm_stats", FP32 * rows, "heads"),
    ]


def mla_latents_saved(attn, e: int) -> list[Saved]:
    """MLA's latents, whole on every tensor rank (sequence-split under Megatron-SP): the query latent
    and the K/V latent with the rope key as the down-projections write them, and each latent normed
    (the up-projections' inputs) with its norm's fp32 statistics."""
    items = [
        Saved("kv_latent", e * (attn.kv_lora_rank + attn.rope_head_dim), "hidden"),
        Saved("kv_latent_normed", e * attn.kv_lora_rank, "hidden"),
        Saved("kv_latent_norm_stats", FP32, "hidden"),
    ]
    if attn.q_lora_rank:
        items += [
            Saved("q_latent", e * attn.q_lora_rank, "hidden"),
            Saved("q_latent_normed", e * attn.q_lora_rank, "hidden"),
            Saved("q_latent_norm_stats", FP32, "hidden"),
        ]
    return items


def mla_gemms(a, head_div: int) -> list[tuple[float, float]]:
    """MLA's projections on one rank: the down-projections whole, the up- and output projections a
    1/head_div share of the heads."""
    nope = a.head_dim - a.rope_head_dim
    if a.q_lora_rank:
        q = [(a.q_lora_rank, a.hidden), (a.q_width / head_div, a.q_lora_rank)]
    else:
        q = [(a.q_width / head_div, a.hidden)]
    kv = [(a.kv_lora_rank + a.rope_head_dim, a.hidden), (a.heads * (nope + a.v_head_dim) / head_div, a.kv_lora_rank)]
    return q + kv + [(a.out_hidden, a.out_width / head_div)]


class Attention(BlockKind):
    name = "attention"
    attends = True

    def params(self, model):
        return model.attention.param_count()

    def norm_width(self, model):
        return model.attention.hidden

    def streamed_params(self, model):
        """Less every norm scale — the input's, the query/key norms', the output's, MLA's latents' — each
        kept whole on every TSP rank, its gradient summed over tsp (axes/tsp.step_comms: norm_params)."""
        return self.params(model) - self.norm_width(model) - model.attention.norm_extra

    def output_width(self, model):
        return model.attention.out_hidden

    def gemms(self, model, head_div):
        a = model.attention
        if a.mla:
            return mla_gemms(a, head_div)
        return [((a.q_width + 2 * a.kv_width) / head_div, a.hidden), (a.out_hidden, a.q_width / head_div)]

    def memory_bound_bytes_per_token(self, model, head_div, e):
        a = model.attention
        if a.mla:  # + the latents' norms (read, write) and K assembled from its nope part and the rope key
            latents = 2 * (a.q_lora_rank + a.kv_lora_rank)
            return e * (5 * a.hidden + latents + (2 * a.q_width + 3 * a.kv_width) / head_div)
        # + the rotary on q and k (read, write); query/key norms (Qwen3's, Gemma3's, OLMo2's) read and write q
        # and k once more
        qk = 2 * (a.q_width + a.kv_width) / head_div
        return e * (5 * a.hidden + qk + (qk if a.qk_norm else 0.0))

    def saved(self, model, opts):
        return attention_saved(model, opts)

    def core_s(self, model, tokens, keys, sh, e, dev, *, causal_fraction, zigzag):
        """Causal attention of `tokens` local queries over `keys` keys, a query seeing `causal_fraction`
        of them on average: 4·t·s·(a·d)·fraction FLOPs at the fused kernel's rate (the prefix kernel's
        on sequence shards), or under a zigzag split the slowest rank's two prefix attentions; sliding
        windows see min(i, w) keys. MLA's core is over its query/key and value head widths (core_width)."""
        head_div = sh.head_div
        width = model.attention.core_width
        core_flops = 4 * tokens * keys * width / head_div * causal_fraction
        if keys <= 1:
            attn = 0.0
        elif not dev.flash_attention:
            attn = unfused_attention_s(model, tokens, keys, head_div, e, dev)
        elif zigzag > 1:
            attn = zigzag_attention_s(width / head_div, tokens, keys, zigzag, dev)
        else:
            attn = core_flops / (dev.peak_flops * attention_efficiency(keys, sh.token_div > 1, dev))
        windowed = model.windowed_share(keys) if keys > 1 else 0.0
        if windowed:
            # A sliding window of w keys: a query sees min(i, w) of them, w − w²/2s on average over s
            # positions, instead of s/2; one invocation here is the mean over the window and full layers.
            w = model.attention_window
            window_flops = 4 * tokens * (w - w * w / (2 * keys)) * width / head_div
            window_s = window_flops / (dev.peak_flops * attention_efficiency(w, sh.token_div > 1, dev))
            attn = (1 - windowed) * attn + windowed * window_s
            core_flops = (1 - windowed) * core_flops + windowed * window_flops
        return attn, core_flops

    def shard_motion_s(self, model, tokens, sh, e, dev, *, zigzag) -> tuple[float, float]:
        """(forward, backward) seconds of the data motion around a zigzag shard's attention kernels, where
        the stack moves it (Device.zigzag_motion: meshplan's executor), at its ops' measured rate
        (device.ZIGZAG_MOTION_HBM_FRACTION of the rated HBM rate); the
        backward redoes the forward's where the stack recomputes sequence shards' attention. A stack with
        Mamba layers has contiguous shards in the executor (TSP's too: executor/layouts/layer.py), no reorder."""
        if zigzag <= 1 or model.mamba_layers or not sh.gathers_kv or not dev.zigzag_motion:
            return 0.0, 0.0
        a = model.attention
        fwd, bwd = zigzag_motion_bytes(tokens, zigzag, a.q_width / sh.head_div, a.kv_width / sh.head_div, e)
        if dev.sequence_attention_recompute:
            bwd += fwd
        rate = dev.rated_hbm * ZIGZAG_MOTION_HBM_FRACTION
        return fwd / rate, bwd / rate

    def core_bwd_factor(self, dev):
        return ATTENTION_BWD_FACTOR if dev.flash_attention else UNFUSED_ATTENTION_BWD_FACTOR

    def partial_recompute_s(self, model, recompute, sh, *, gemm, core, mem, kernel_fwd, tokens, e, dev):
        # Selective recompute redoes the core; sequence shards keep only their local q, k, v, so the
        # core is recomputed in backward there too — where the stack does (Device.sequence_attention_recompute).
        redo = "core_attn" in selective_modules(recompute) or (sh.gathers_kv and dev.sequence_attention_recompute)
        return core if redo else 0.0

    def selective_recompute_flops(self, model, tokens, seq):
        """Korthikanti et al. 2022 Eq. 8: selective recompute redoes the attention core's forward."""
        return 4 * tokens * seq * model.attention.core_width * 0.5

    def decode(self, comp, model, batch, seq, sh, opts, dev):
        """Decode attention reads the local KV cache once per token: memory-bound, at the rate torch's
        decode attention measured (DECODE_ATTENTION_HBM_FRACTION). MLA reads its latent cache, whole on
        every tensor rank, and attends over it with the up-projections absorbed."""
        a = model.attention
        cache_div = sh.head_div if a.kv_cache_split_by_heads else 1
        kv_bytes = batch * seq / sh.token_div * a.kv_cache_width / cache_div * opts.nbytes("kv_cache_dtype")
        flops = 4 * batch * seq / sh.token_div * a.decode_core_width / sh.head_div
        t = max(
            flops / (dev.peak_flops * ATTENTION_EFFICIENCY), kv_bytes / (dev.rated_hbm * DECODE_ATTENTION_HBM_FRACTION)
        )
        motion = 0.0
        if sh.streams_weights and dev.tsp_motion:
            # TSP's decode step (executor/layouts/tsp.py TSPAttention.decode): the rank's shard packed (2W), the
            # output zero-filled and each of the D shards' partial outputs added in (X + 3·D·X, X = batch · h · e)
            e, d = opts.nbytes("act_dtype"), sh.weight_div
            x = batch * model.d_model * e
            motion = (2 * self.streamed_params(model) / d * e + x + 3 * d * x) / (dev.rated_hbm * TORCH_OP_HBM_FRACTION)
        return BlockCompute(comp.gemm_fwd_s, t, comp.mem_fwd_s, 0.0, comp.flops_fwd, motion_fwd_s=motion)


ATTENTION = Attention()

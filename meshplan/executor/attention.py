"""The executor's attention core: whole-sequence causal attention, and a sequence shard's attention over
the keys up to the end of its own tokens. Tensors are head-major, as SDPA takes them: q (b, a, t, d),
k and v (b, a_kv, S, d) with a_kv dividing a (GQA: query head i reads KV head i // (a / a_kv)).

Whole sequence (t = S): SDPA with is_causal. On Hopper and later, cuDNN's fused kernel is asked for
first (priority cuDNN → FlashAttention-2 → memory-efficient → math). cuDNN runs causal attention 1.75-1.9×
FlashAttention-2's rate on an H100 (benchmarks/results/rates-h100.json), but torch 2.11 with cuDNN 9.19
already picks it by default there: asking first changed the whole-sequence time by ×0.92-1.01 (H100) and
×0.98-1.01 (H200) at 4K-32K (attention-paths-h100.json, attention-paths-h200.json). The gain is the
shard's.

A shard (t < S, lower-right causal: query i sees keys up to S − t + i) is two blocks — the off-diagonal
keys [0, S − t), which every query sees whole, and the square causal diagonal [S − t, S) — each run by a
fused kernel that returns its log-sum-exp, the outputs merged by those (ring attention's merge:
TransformerEngine's AttnFuncWithCPAndKVP2P, flash-attn's ring implementations, torch's
_context_parallel/_attention.py _SDPAMerger). The backward runs each block's backward given the merged
output and log-sum-exp, which make each block's probabilities the merged softmax's
(FlashAttention-2 Alg. 2: dS = P ∘ (dP − rowsum(dO ∘ O))). A lower-right causal bias on SDPA instead
reached only the memory-efficient kernel, with GQA's K/V repeated to every query head.

Saved for backward: q, k, v, the merged output and its fp32 log-sum-exp per query head — what a fused
kernel saves for whole-sequence attention and what meshplan.costmodel.blocks.attention counts (the
executor's shards recompute attention in backward, so these live only there).

On the CPU, and wherever no fused kernel takes the blocks, the same blockwise forward and backward run
in plain torch (MATH_BLOCKS), which is also the reference the tests hold the kernels' path to.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from meshplan.kernels.reference import acc

# SDPA's backends in the order the executor asks for them on Hopper and later.
CUDNN_FIRST = [
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
]
# cuDNN releases up to 9.15.0 give wrong results for sequence lengths that are not multiples of 128
# (torch's sdp_utils.cpp check_prefer_cudnn_attention asks for > 9.15.0 before preferring cuDNN,
# pytorch/pytorch#169849; NVIDIA/cudnn-frontend#160: NaN gradients at such lengths): below it the
# executor takes cuDNN only for lengths that are.
CUDNN_ANY_LENGTH_VERSION = 91500
CUDNN_LENGTH_MULTIPLE = 128


def _cudnn_takes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> bool:
    """Whether cuDNN's fused attention runs these head-major tensors on this GPU: Hopper or later,
    lengths it computes right, and torch's own check (dtype, head dim, GQA, strides)."""
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] < 9:
        return False
    version = torch.backends.cudnn.version() or 0
    lengths = (q.shape[-2], k.shape[-2])
    if version <= CUDNN_ANY_LENGTH_VERSION and any(n % CUDNN_LENGTH_MULTIPLE for n in lengths):
        return False
    params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, causal, k.shape[1] != q.shape[1])
    return torch.backends.cuda.can_use_cudnn_attention(params)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Whole-sequence causal attention (t = S) → (b, a, t, d); GQA K/V are not repeated."""
    gqa = k.shape[1] != q.shape[1]
    prefer = sdpa_kernel(CUDNN_FIRST, set_priority=True) if _cudnn_takes(q, k, v, True) else nullcontext()
    with prefer:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


# -- one block's attention with its log-sum-exp, three ways -------------------------------------------------


@dataclass(frozen=True)
class Blocks:
    """A kernel for one block: forward(q, k, v, causal) → (out, lse (b, a, t) fp32, what its backward
    needs beyond the tensors); backward(dout, q, k, v, out, lse, causal, extra) → (dq, dk, dv). `causal`
    blocks are square."""

    name: str
    forward: Callable
    backward: Callable


def _math_forward(q, k, v, causal):
    """Plain torch, in the accumulation dtype, query heads grouped onto their KV head without copying K/V."""
    b, a, t, d = q.shape
    scores = _grouped_scores(q, k, causal)  # (b, a_kv, rep, t, S)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    out = torch.einsum("bgrts,bgsd->bgrtd", probs, acc(v)).reshape(b, a, t, d).to(q.dtype)
    return out, lse.reshape(b, a, t), None


def _grouped_scores(q, k, causal):
    b, a, t, d = q.shape
    a_kv = k.shape[1]
    qg = acc(q).reshape(b, a_kv, a // a_kv, t, d)
    scores = torch.einsum("bgrtd,bgsd->bgrts", qg, acc(k)) / math.sqrt(d)
    if causal:
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return scores


def _math_backward(dout, q, k, v, out, lse, causal, extra):
    """The block's gradients from the merged output and log-sum-exp (FlashAttention-2 Alg. 2)."""
    b, a, t, d = q.shape
    a_kv = k.shape[1]
    group = (b, a_kv, a // a_kv, t)
    probs = torch.exp(_grouped_scores(q, k, causal) - acc(lse).reshape(group).unsqueeze(-1))
    do = acc(dout).reshape(*group, d)
    dv = torch.einsum("bgrts,bgrtd->bgsd", probs, do)
    dprobs = torch.einsum("bgrtd,bgsd->bgrts", do, acc(v))
    rowdot = (do * acc(out).reshape(*group, d)).sum(-1, keepdim=True)
    dscores = probs * (dprobs - rowdot) / math.sqrt(d)
    dq = torch.einsum("bgrts,bgsd->bgrtd", dscores, acc(k)).reshape(b, a, t, d)
    dk = torch.einsum("bgrts,bgrtd->bgsd", dscores, acc(q).reshape(*group, d))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


MATH_BLOCKS = Blocks("math", _math_forward, _math_backward)


def _cudnn_forward(q, k, v, causal):
    # aten::_scaled_dot_product_cudnn_attention(query, key, value, attn_bias, compute_log_sumexp,
    # dropout_p, is_causal, return_debug_mask) → (output, logsumexp (b, a, t, 1), cum_seq_q, cum_seq_k,
    # max_q, max_k, philox_seed, philox_offset, debug_attn_mask): the same on torch 2.11 and 2.13.
    out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, causal, False
    )
    return out, lse.reshape(lse.shape[:3]), (cum_q, cum_k, max_q, max_k, seed, offset)


def _cudnn_backward(dout, q, k, v, out, lse, causal, extra):
    cum_q, cum_k, max_q, max_k, seed, offset = extra
    # cuDNN reads the log-sum-exp at the sizes and strides it is given (aten/src/ATen/native/cudnn/MHA.cpp)
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        dout, q, k, v, out, lse.unsqueeze(-1), seed, offset, None, cum_q, cum_k, max_q, max_k, 0.0, causal
    )


CUDNN_BLOCKS = Blocks("cudnn", _cudnn_forward, _cudnn_backward)


def _flash_forward(q, k, v, causal):
    # aten::_scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, return_debug_mask)
    # → (output, logsumexp (b, a, t), cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused, debug_mask);
    # FlashAttention-2 takes GQA's K/V as they are.
    out, lse, cum_q, cum_k, max_q, max_k, rng, unused, _ = torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, causal, False
    )
    return out, lse, (cum_q, cum_k, max_q, max_k, rng, unused)


def _flash_backward(dout, q, k, v, out, lse, causal, extra):
    cum_q, cum_k, max_q, max_k, rng, unused = extra
    return torch.ops.aten._scaled_dot_product_flash_attention_backward(
        dout, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, rng, unused
    )


FLASH_BLOCKS = Blocks("flash", _flash_forward, _flash_backward)


def _flash_takes(q, k, v, causal):
    params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, causal, k.shape[1] != q.shape[1])
    return torch.backends.cuda.can_use_flash_attention(params)


def shard_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Blocks | None:
    """The kernel that runs both blocks of a shard's attention: cuDNN (Hopper and later), else
    FlashAttention-2, on the GPU; plain torch on the CPU; None where no fused kernel takes them on the GPU."""
    past = k.shape[2] - q.shape[2]
    return _blocks_taking([(q, k[:, :, past:], v[:, :, past:], True), (q, k[:, :, :past], v[:, :, :past], False)])


def _blocks_taking(cases: list) -> Blocks | None:
    """The first fused kernel (cuDNN, then FlashAttention-2) that takes every (q, k, v, causal) case on the
    GPU; plain torch on the CPU; None where none takes them all."""
    if not cases[0][0].is_cuda:
        return MATH_BLOCKS
    for blocks, takes in ((CUDNN_BLOCKS, _cudnn_takes), (FLASH_BLOCKS, _flash_takes)):
        if all(takes(*case) for case in cases):
            return blocks
    return None


def _merge(merged: torch.Tensor, lse: torch.Tensor, o: torch.Tensor, lse_o: torch.Tensor) -> torch.Tensor:
    """Merge a block's output `o` (log-sum-exps `lse_o`) into `merged` (the accumulation dtype, in place; its
    log-sum-exps `lse`) and return the merged log-sum-exps: merged·exp(lse − total) + o·exp(lse_o − total),
    as merged + w·(o − merged) with w = exp(lse_o − total)."""
    total = torch.logaddexp(lse, lse_o)
    merged.lerp_(acc(o), torch.exp(lse_o - total).unsqueeze(-1))
    return total


# -- a shard: off-diagonal and diagonal blocks merged by their log-sum-exps ---------------------------------


class _ShardAttention(torch.autograd.Function):
    """q (b, a, t, d) over k, v (b, a_kv, S, d), S > t, lower-right causal."""

    @staticmethod
    def forward(ctx, q, k, v, blocks):
        past = k.shape[2] - q.shape[2]
        o_off, lse_off, extra_off = blocks.forward(q, k[:, :, :past], v[:, :, :past], False)
        o_diag, lse_diag, extra_diag = blocks.forward(q, k[:, :, past:], v[:, :, past:], True)
        # in place in the accumulation dtype: two fp32 copies of the output live at once, beside the blocks'
        out = acc(o_off)
        lse = _merge(out, lse_off, o_diag, lse_diag)
        out = out.to(q.dtype)
        ctx.blocks, ctx.extra = blocks, (extra_off, extra_diag)
        ctx.save_for_backward(q, k, v, out, lse.contiguous())
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        blocks, (extra_off, extra_diag) = ctx.blocks, ctx.extra
        past = k.shape[2] - q.shape[2]
        dout = dout.contiguous() if dout.stride(-1) != 1 else dout
        dq_off, dk_off, dv_off = blocks.backward(dout, q, k[:, :, :past], v[:, :, :past], out, lse, False, extra_off)
        dq_diag, dk_diag, dv_diag = blocks.backward(dout, q, k[:, :, past:], v[:, :, past:], out, lse, True, extra_diag)
        return dq_off + dq_diag, torch.cat([dk_off, dk_diag], 2), torch.cat([dv_off, dv_diag], 2), None


def shard_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A shard's t queries — the last t of S positions — over all S keys, lower-right causal → (b, a, t, d)."""
    t, kv_len = q.shape[2], k.shape[2]
    if kv_len == t:
        return causal_attention(q, k, v)
    if t == 0 or kv_len < t:
        raise ValueError(f"a shard's {t} queries need at least as many keys, not {kv_len}")
    blocks = shard_blocks(q, k, v)
    if blocks is None:  # no fused kernel takes the blocks (fp32, a head dim past 256): one masked SDPA
        return masked_shard_attention(q, k, v)
    return _ShardAttention.apply(q, k, v, blocks)


def masked_shard_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A shard's attention as one SDPA call with a lower-right causal bias, K/V repeated per query head
    (CausalBias takes no enable_gqa): the executor's path before the blocks, kept where no fused kernel
    takes them and as the baseline benchmarks/bench_attention_paths.py times them against."""
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]))


# -- a zigzag shard: its two query chunks over runs of the gathered keys, as they arrive -----------------

# Whether attend_zigzag takes the runs (zigzag_attention) or puts the gathered keys in position order first
# (index_select, and its inverse on the gradients), as the executor has since run 36. Off until timed on GPUs:
# `timeout 300 torchrun --nproc-per-node 2 benchmarks/probes/s23_zigzag_probe.py` times both in one process
# (session 23 wrote it with no device time left). Counted by aten op on the CPU (benchmarks/zigzag_bytes.py,
# benchmarks/results/zigzag-bytes-cpu.txt), one 16K-token dense-7b layer's attention at sp=2 moves 29.6 and
# 32.6 gathered-K sizes outside its kernels by runs (ranks 0 and 1) against 34.6 and 38.6 by the reorder: its
# index_select, cat and slice-backward passes gone, in-place adds and the output's assembly left. That is multi-head
# attention at 2 shards: every further run merges through fp32 over the chunk's whole output, so with GQA (32 query,
# 8 KV heads) at 4 shards the runs count 1.3-1.4x the reorder's (a review's count) — merging all runs in one pass is
# the change to make before switching it on, and the probe should time GQA at 4 shards too.
ZIGZAG_RUNS = False


@dataclass(frozen=True)
class KeyRun:
    """Keys [start, start + length) of the all-gathered K/V (rank-major), seen whole or (causal) as the
    square diagonal of a query chunk."""

    start: int
    length: int
    causal: bool


def zigzag_runs(parts: int, index: int, chunk: int) -> tuple[tuple[KeyRun, ...], tuple[KeyRun, ...]]:
    """The key runs rank `index` of a zigzag split over `parts` ranks attends, for its first query chunk
    (position index) and its second (position 2·parts − 1 − index), in the all-gather's rank-major order
    (rank s holds positions s and 2·parts − 1 − s, `chunk` tokens each, at s · 2·chunk). The first sees
    the first chunks of ranks before it whole and its own causally; the second sees every rank's first
    chunk, and the second chunks of the ranks after it — one run from rank index + 1 to the end — whole,
    and its own causally. A key a query does not see is in no run."""
    span = 2 * chunk
    before = tuple(KeyRun(s * span, chunk, False) for s in range(index))
    first = before + (KeyRun(index * span, chunk, True),)
    second = before + (KeyRun(index * span, chunk, False), KeyRun(index * span + chunk, chunk, True))
    if index < parts - 1:
        second += (KeyRun((index + 1) * span, (parts - 1 - index) * span, False),)
    return first, second


def run_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, runs) -> Blocks | None:
    """The kernel that takes every run of the zigzag plan (`runs`: the query chunks' KeyRun tuples) for
    queries q (b, a, t, d) and gathered k, v (b, a_kv, S, d): as shard_blocks picks."""
    qc = q[:, :, : q.shape[2] // len(runs)]
    shapes = {(r.length, r.causal) for chunk in runs for r in chunk}
    return _blocks_taking([(qc, k[:, :, :n], v[:, :, :n], causal) for n, causal in shapes])


class _ZigzagAttention(torch.autograd.Function):
    """q (b, t, a, d) — a rank's two zigzag chunks — over k, v (b, S, a_kv, d) as the all-gather left them
    (rank-major): each query chunk's runs (zigzag_runs) through the fused kernel, merged by their
    log-sum-exps; the backward writes each run's key gradients into its place of the gathered-size
    gradient. No reordering of the gathered keys either way: they go back to the reduce-scatter as they
    came. Saved: q, k, v, the merged output and its log-sum-exps (what _ShardAttention saves)."""

    @staticmethod
    def forward(ctx, q, k, v, runs, blocks):
        b, t, a, d = q.shape
        c = t // len(runs)
        qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        out = torch.empty_like(q)
        lses, extras = [], []
        for i, chunk in enumerate(runs):
            qi = qh[:, :, i * c : (i + 1) * c]
            merged = lse = None
            for r in chunk:
                o, lse_r, extra = blocks.forward(
                    qi, kh[:, :, r.start : r.start + r.length], vh[:, :, r.start : r.start + r.length], r.causal
                )
                extras.append(extra)
                if merged is None:
                    merged, lse = acc(o), lse_r
                else:
                    lse = _merge(merged, lse, o, lse_r)
            out[:, i * c : (i + 1) * c] = merged.to(q.dtype).transpose(1, 2)
            lses.append(lse.contiguous())
        ctx.runs, ctx.blocks, ctx.extras = runs, blocks, extras
        ctx.save_for_backward(q, k, v, out, *lses)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, *lses = ctx.saved_tensors
        runs, blocks, extras = ctx.runs, ctx.blocks, iter(ctx.extras)
        c = q.shape[1] // len(runs)
        qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        dq = torch.empty_like(q)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        for i, chunk in enumerate(runs):
            rows = slice(i * c, (i + 1) * c)
            # the chunk's output and its gradient head-major and contiguous alike (cuDNN's backward wants the two
            # with the same strides)
            oi, doi = out[:, rows].transpose(1, 2).contiguous(), dout[:, rows].transpose(1, 2).contiguous()
            qi, dqi = qh[:, :, rows], None
            for r in chunk:
                keys = slice(r.start, r.start + r.length)
                dq_r, dk_r, dv_r = blocks.backward(
                    doi, qi, kh[:, :, keys], vh[:, :, keys], oi, lses[i], r.causal, next(extras)
                )
                dqi = dq_r if dqi is None else dqi.add_(dq_r)
                dk[:, keys] += dk_r.transpose(1, 2)
                dv[:, keys] += dv_r.transpose(1, 2)
            dq[:, rows] = dqi.transpose(1, 2)
        return dq, dk, dv, None, None


def zigzag_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, parts: int, index: int) -> torch.Tensor | None:
    """Rank `index`'s zigzag queries q (b, t, a, d) over the all-gathered k, v (b, S, a_kv, d) in their
    rank-major order → (b, t, a, d); None where no fused kernel takes the runs (the caller reorders the
    keys and masks instead)."""
    runs = zigzag_runs(parts, index, q.shape[1] // 2)
    blocks = run_blocks(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), runs)
    if blocks is None:
        return None
    return _ZigzagAttention.apply(q, k, v, runs, blocks)

"""Plain (single-GPU, mesh-unaware) dense decoder layers, their mixture-of-experts form, Mamba-2 blocks, and
a mixed model's layers of one block each (Nemotron-H's: Mamba-2, attention, MLP or MoE).

The executor's layouts parallelize these from the outside. What they save for backward is what
`meshplan.costmodel.activations` counts; tests/test_saved_activations.py holds the two together.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from meshplan.executor.attention import causal_attention
from meshplan.executor.experts import activate, expert_mlp, routed_experts
from meshplan.executor.rotary import Rotary, rotate_qk
from meshplan.kernels.launch import SSD_CHUNK
from meshplan.kernels.reference import acc, causal_conv1d_ref, ssd_chunked_ref
from meshplan.models import ModelSpec, MoeSpec


def rms_norm_rows(x, weight, eps):
    """(RMSNorm of x over its last dimension, the fp32 rstd of each row) — what the norm's backward
    (rms_norm_rows_grad) needs beside x."""
    rstd = torch.rsqrt(acc(x).pow(2).mean(-1, keepdim=True) + eps)
    return (acc(x) * rstd).to(x.dtype) * weight, rstd


def rms_norm_rows_grad(x, weight, rstd, grad_out):
    """The gradients of x and of the scale of rms_norm_rows, from its output's."""
    xhat = acc(x) * rstd
    g = acc(grad_out) * acc(weight)
    grad_x = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    grad_w = (acc(grad_out) * xhat).reshape(-1, x.shape[-1]).sum(0)
    return grad_x.to(x.dtype), grad_w.to(weight.dtype)


class _RMSNormFn(torch.autograd.Function):
    """RMSNorm that keeps only its input and the fp32 rstd per row for backward."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        out, rstd = rms_norm_rows(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, rstd = ctx.saved_tensors
        return (*rms_norm_rows_grad(x, weight, rstd, grad_out), None)


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        if x.is_cuda:  # Triton: saves the same (x, fp32 rstd) and makes no fp32 copies of x in backward
            from meshplan.kernels.gated_norm import rmsnorm_triton

            return rmsnorm_triton(x, self.weight, self.eps)
        return _RMSNormFn.apply(x, self.weight, self.eps)


def head_norm(t: torch.Tensor, norm: RMSNorm, head_dim: int) -> torch.Tensor:
    """t (b, s, n·head_dim), a projection's query or key heads, each head RMS-normed over its head_dim
    channels by `norm`'s (head_dim,) scale (Qwen3's q_norm / k_norm); a new tensor. Backward keeps t
    (a view of the QKV projection's output, whose v the core keeps anyway) and on the CPU the fp32
    rstd of each head; on the GPU the Triton norm reads the heads where they lie, as groups of t's
    channels (its scale repeated to t's width), and keeps nothing in fp32."""
    if t.is_cuda:
        from meshplan.kernels.gated_norm import gated_rmsnorm_triton

        return gated_rmsnorm_triton(t, None, norm.weight.repeat(t.shape[-1] // head_dim), head_dim, norm.eps)
    return _RMSNormFn.apply(t.unflatten(-1, (-1, head_dim)), norm.weight, norm.eps).flatten(-2)


def qk_norms_of(module: nn.Module) -> tuple[RMSNorm, RMSNorm] | None:
    """A layer's (or its attention sublayer's) query and key norms (Qwen3's), or None where the model has
    none."""
    return (module.q_norm, module.k_norm) if hasattr(module, "q_norm") else None


def qkv_heads(qkv, rotary, positions, heads: int, kv_heads: int, head_dim: int, qk_norms=None, q_scale: float = 1.0):
    """q (b, s, heads, d), k and v (b, s, kv_heads, d) of a fused QKV projection's output (b, s,
    (heads + 2·kv_heads)·d) for tokens at `positions`: q and k turned by the rotary (in place). With
    `qk_norms` (the query and the key RMSNorm, Qwen3's), each head of q and k is normed first, as
    transformers' Qwen3Attention norms before the rotary; the core then keeps the norms' outputs, and
    the norms the projection's q and k (memory model: the attention block's qk_normed). `q_scale`
    multiplies q (a softmax scale other than head_dim^-½)."""
    b, s, _ = qkv.shape
    q_w, kv_w = heads * head_dim, kv_heads * head_dim
    if q_scale != 1.0 and qk_norms is None:
        # Zamba2's shared attention: scores scaled by (head_dim / 2)^-½ (SharedBlock.q_scale). In place,
        # as the rotary turns q (the rotation is linear): no copy of q beside the QKV output k, v keep.
        qkv[..., :q_w].mul_(q_scale)
    if qk_norms is None:
        q, k, v = rotate_qk(qkv, rotary, positions, q_w, kv_w, head_dim).split([q_w, kv_w, kv_w], dim=-1)
    else:
        q_norm, k_norm = qk_norms
        q = rotate_qk(head_norm(qkv[..., :q_w], q_norm, head_dim), rotary, positions, q_w, 0, head_dim)
        k = rotate_qk(head_norm(qkv[..., q_w : q_w + kv_w], k_norm, head_dim), rotary, positions, kv_w, 0, head_dim)
        v = qkv[..., q_w + kv_w :]
    q = q.view(b, s, heads, head_dim)
    if q_scale != 1.0 and qk_norms is not None:
        q = q * q_scale
    return q, k.view(b, s, kv_heads, head_dim), v.view(b, s, kv_heads, head_dim)


class _GeGLUFn(torch.autograd.Function):
    """GeGLU (an exact GeLU of the gate, times up) keeping only its input h = [gate; up] for backward, as
    experts.SwiGLUFn keeps SwiGLU's: what the memory model counts (gate, up and the product)."""

    @staticmethod
    def forward(ctx, h):
        ctx.save_for_backward(h)
        gate, up = h.chunk(2, dim=-1)
        return F.gelu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        (h,) = ctx.saved_tensors
        with torch.enable_grad():
            leaf = h.detach().requires_grad_(True)
            gate, up = leaf.chunk(2, dim=-1)
            (grad_h,) = torch.autograd.grad(F.gelu(gate) * up, leaf, grad)
        return grad_h


def mlp_activation(module: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """A dense MLP's activation of its input projection h, as `module` (a layer or its MLP sublayer)
    says: SwiGLU of h's [gate; up] halves, GeGLU (an exact GeLU of the gate: Zamba2's), the squared
    ReLU (Nemotron-H's) or GeLU."""
    if module.gated:
        return _GeGLUFn.apply(h) if getattr(module, "geglu", False) else activate(h, gated=True)
    return activate(h, gated=False) if module.relu2 else F.gelu(h)


def _init(linear_out: int, linear_in: int, generator: torch.Generator | None = None) -> nn.Parameter:
    w = torch.empty(linear_out, linear_in)
    nn.init.normal_(w, std=1.0 / math.sqrt(linear_in), generator=generator)
    return nn.Parameter(w)


def attention_core(q, k, v, flash: bool):
    """q (b, s, a, d), k/v (b, s, a_kv, d) → (b, s, a·d). Causal."""
    b, s, a, d = q.shape
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if flash:
        out = causal_attention(qh, kh, vh)  # cuDNN's fused kernel first on Hopper (meshplan.executor.attention)
    else:
        rep = a // kh.shape[1]
        kh, vh = kh.repeat_interleave(rep, 1), vh.repeat_interleave(rep, 1)
        scores = torch.matmul(qh, kh.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        mask = torch.full((s, s), float("-inf"), dtype=scores.dtype, device=q.device).triu(1)
        out = torch.matmul(torch.softmax(scores + mask, dim=-1), vh)
    return out.transpose(1, 2).reshape(b, s, a * d)


class DenseLayer(nn.Module):
    """Pre-norm decoder layer: RMSNorm → fused QKV → (per-head q, k norms) → rotary q, k → causal SDPA →
    W_O; RMSNorm → SwiGLU MLP."""

    def __init__(self, model: ModelSpec, flash: bool = True, selective_recompute: bool = False):
        super().__init__()
        self._attention_weights(model, flash, selective_recompute)
        self._mlp_weights(model)

    def _attention_weights(self, model: ModelSpec, flash: bool, selective_recompute: bool) -> None:
        attn = model.attention
        self.heads, self.kv_heads, self.head_dim = attn.heads, attn.kv_heads, attn.head_dim
        self.flash, self.selective = flash, selective_recompute
        self.q_scale = 1.0  # SharedBlock's differs
        self.attn_norm = RMSNorm(attn.hidden, model.norm_eps)
        # rope kind "none": no positions at all (Nemotron-H); rotate_qk leaves q and k as they are
        self.rotary = Rotary(model.rope, attn.head_dim) if model.rope.kind != "none" else None
        self.w_qkv = _init(attn.q_width + 2 * attn.kv_width, attn.hidden)
        self.w_o = _init(attn.out_hidden, attn.q_width)
        if attn.qk_norm:
            # Qwen3's query and key norms: a (head_dim,) scale each, over every head (ones at first, as
            # RMSNorm's); executor.support drops OLMo2's, over the whole query and key widths.
            if attn.qk_norm != 2 * attn.head_dim:
                raise ValueError(f"the executor norms queries and keys per head, not over {model.name}'s widths")
            self.q_norm = RMSNorm(attn.head_dim, model.norm_eps)
            self.k_norm = RMSNorm(attn.head_dim, model.norm_eps)

    @property
    def qk_norms(self) -> tuple[RMSNorm, RMSNorm] | None:
        return qk_norms_of(self)

    def _mlp_weights(self, model: ModelSpec) -> None:
        mlp = model.mlp
        self.mlp_norm = RMSNorm(mlp.hidden, model.norm_eps)
        self.gated, self.relu2, self.geglu = mlp.gated, mlp.relu2, mlp.geglu
        self.w_in = _init(mlp.n_input_matrices * mlp.ffn_hidden, mlp.hidden)  # [gate; up] when gated
        self.w_down = _init(mlp.out_hidden, mlp.ffn_hidden)

    def attention(self, x, qkv_adapter=None):
        """What attention adds for x; `qkv_adapter` (a hybrid layer's, adapter_delta) adds to QKV's output."""
        xn = self.attn_norm(x)
        qkv = F.linear(xn, self.w_qkv)
        if qkv_adapter is not None:
            qkv = qkv + adapter_delta(xn, *qkv_adapter)
        positions = torch.arange(x.shape[1], device=x.device)
        q, k, v = qkv_heads(
            qkv, self.rotary, positions, self.heads, self.kv_heads, self.head_dim, self.qk_norms, self.q_scale
        )
        if self.selective and not self.flash:
            out = checkpoint(attention_core, q, k, v, self.flash, use_reentrant=False)
        else:
            out = attention_core(q, k, v, self.flash)
        return F.linear(out, self.w_o)

    def mlp(self, x, adapter=None):
        """What the MLP adds for x; `adapter` (a hybrid layer's, adapter_delta) adds to [gate; up]'s output."""
        xn = self.mlp_norm(x)
        h = F.linear(xn, self.w_in)
        if adapter is not None:
            h = h + adapter_delta(xn, *adapter)
        return F.linear(mlp_activation(self, h), self.w_down)

    def forward(self, x):
        x = x + self.attention(x)
        return x + self.mlp(x)


def route(
    xn: torch.Tensor, w_router: torch.Tensor, moe: MoeSpec, score_bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing of tokens xn (T, h) by `moe`'s router (top_k_of). Returns (weights (T, k), expert
    indices (T, k))."""
    return top_k_of(F.linear(xn, w_router), moe, score_bias)


def top_k_of(
    logits: torch.Tensor, moe: MoeSpec, score_bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """route's choice from the router's logits (T, E) (computed elsewhere: TSP's router ring).

    softmax (transformers' MixtralTopKRouter, Qwen2/3-MoE): the k largest probabilities. sigmoid
    (transformers' NemotronHTopkRouter, DeepSeek-V3's): the k largest of sigmoid + `score_bias` (the
    e_score_correction_bias buffer) among the topk_groups groups whose two best biased scores sum
    highest, weighted by their unbiased sigmoid. Either way the weights are renormalised to sum to one
    where norm_topk (Qwen's norm_topk_prob), then times routed_scaling."""
    if moe.score == "softmax":
        weights, experts = torch.topk(torch.softmax(logits, dim=-1), moe.top_k, dim=-1)
    else:
        scores = torch.sigmoid(logits)
        choice = scores if score_bias is None else scores + score_bias
        if moe.topk_groups < moe.expert_groups:
            grouped = choice.view(choice.shape[0], moe.expert_groups, -1)
            best = grouped.topk(min(2, grouped.shape[-1]), dim=-1)[0].sum(-1)
            kept = torch.zeros_like(best, dtype=torch.bool).scatter_(1, best.topk(moe.topk_groups, dim=-1)[1], True)
            choice = grouped.masked_fill(~kept.unsqueeze(-1), float("-inf")).view_as(choice)
        experts = torch.topk(choice, moe.top_k, dim=-1)[1]
        weights = scores.gather(1, experts)
    if moe.norm_topk:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights * moe.routed_scaling if moe.routed_scaling != 1.0 else weights), experts


def shared_expert(module: nn.Module, xn: torch.Tensor) -> torch.Tensor | None:
    """What `module`'s shared experts add for every token of xn (T, h) — one SwiGLU of the shared width,
    behind Qwen2-MoE's sigmoid gate (a hidden → 1 projection) where the model has one — or None."""
    if not hasattr(module, "w_shared_gate_up"):
        return None
    out = expert_mlp(xn, module.w_shared_gate_up, module.w_shared_down, module.gated)
    gate = getattr(module, "w_shared_gate", None)
    return out * torch.sigmoid(F.linear(xn, gate)) if gate is not None else out


class MoEMLP(nn.Module):
    """A mixture of experts behind a pre-norm (Mixtral, Qwen2/3-MoE, Nemotron-H): each token runs its
    top_k experts (route), the outputs weighted by their routing weights and summed, plus the shared
    experts every token runs (Qwen2-MoE: behind a sigmoid gate). Weights as transformers'
    MixtralSparseMoeBlock stores them: router (E, h), experts' [gate; up] (E, 2f, h) — for Nemotron-H's
    ungated squared-ReLU experts up alone (E, f, h), under the same name — and down (E, h, f); the
    shared experts' [gate; up] (2s, h) (up (s, h) ungated), down (h, s) and gate (1, h). A sigmoid
    router keeps its correction bias (E,) as the buffer `score_bias` (NemotronHTopkRouter's
    e_score_correction_bias: it steers the choice, is not trained)."""

    def __init__(self, model: ModelSpec):
        super().__init__()
        moe = model.moe
        if moe.expert_bias or moe.router_bias:
            raise ValueError(f"MoEMLP builds experts without biases: not {model.name}'s")
        self.spec, self.top_k, self.gated = moe, moe.top_k, moe.gated
        width = moe.n_input_matrices * moe.expert_ffn
        self.mlp_norm = RMSNorm(moe.hidden, model.norm_eps)
        self.w_router = _init(moe.experts, moe.hidden)
        self.w_gate_up = nn.Parameter(torch.stack([_init(width, moe.hidden) for _ in range(moe.experts)]))
        self.w_down = nn.Parameter(torch.stack([_init(moe.hidden, moe.expert_ffn) for _ in range(moe.experts)]))
        if moe.score == "sigmoid":
            self.register_buffer("score_bias", torch.zeros(moe.experts))
        if moe.shared_ffn:
            self.w_shared_gate_up = _init(moe.n_input_matrices * moe.shared_ffn, moe.hidden)
            self.w_shared_down = _init(moe.hidden, moe.shared_ffn)
            if moe.shared_gate:
                self.w_shared_gate = _init(1, moe.hidden)

    def forward(self, x):
        """x (b, s, h) → what the MoE adds to the stream (b, s, h)."""
        xn = self.mlp_norm(x).reshape(-1, x.shape[-1])
        weights, experts = route(xn, self.w_router, self.spec, getattr(self, "score_bias", None))
        # Each token's k copies through their experts (one grouped GEMM a projection:
        # meshplan.executor.experts), weighted and summed back per token.
        copies = routed_experts(
            xn,
            experts.reshape(-1),
            self.w_gate_up.shape[0],
            self.w_gate_up,
            self.w_down,
            fold=self.top_k,
            gated=self.gated,
        )
        out = (copies.view(*experts.shape, -1) * weights.unsqueeze(-1)).sum(1)
        shared = shared_expert(self, xn)
        return (out if shared is None else out + shared).view_as(x)


class MoELayer(DenseLayer):
    """A decoder layer whose MLP is a mixture of experts (`moe`, a MoEMLP); attention as DenseLayer's."""

    def __init__(self, model: ModelSpec, flash: bool = True, selective_recompute: bool = False):
        nn.Module.__init__(self)
        self._attention_weights(model, flash, selective_recompute)
        self.moe = MoEMLP(model)

    def mlp(self, x):
        return self.moe(x)


# A mixed model's layers (Nemotron-H: transformers' NemotronHBlock): each layer one block behind its own
# pre-norm and residual — a Mamba-2 mixer (Mamba2Block), attention, a dense MLP or a mixture of experts —
# holding the weights, under the names, of the DenseLayer / MoELayer branch it is, so that the layouts'
# sublayers take them alike.


class AttentionLayer(DenseLayer):
    """A layer that is attention alone: x + attention(x)."""

    def __init__(self, model: ModelSpec, flash: bool = True, selective_recompute: bool = False):
        nn.Module.__init__(self)
        self._attention_weights(model, flash, selective_recompute)

    def forward(self, x):
        return x + self.attention(x)


class MlpLayer(DenseLayer):
    """A layer that is a dense MLP alone: x + mlp(x)."""

    def __init__(self, model: ModelSpec):
        nn.Module.__init__(self)
        self._mlp_weights(model)

    def forward(self, x):
        return x + self.mlp(x)


class MoEOnlyLayer(nn.Module):
    """A layer that is a mixture of experts alone (`moe`, a MoEMLP): x + moe(x)."""

    def __init__(self, model: ModelSpec):
        super().__init__()
        self.moe = MoEMLP(model)

    def forward(self, x):
        return x + self.moe(x)


def mixed_layer(model: ModelSpec, blocks: tuple[str, ...], flash: bool = True, selective: bool = False) -> nn.Module:
    """The reference layer of a mixed model's layer that runs `blocks` (models.ModelSpec.layer_blocks)."""
    if blocks == ("mamba2",):
        return Mamba2Block(model)
    if blocks == ("attention",):
        return AttentionLayer(model, flash, selective)
    if blocks == ("mlp",):
        return MlpLayer(model)
    if blocks in (("router", "experts"), ("router", "experts", "shared_expert")):
        return MoEOnlyLayer(model)
    raise ValueError(f"the executor builds mixed layers of one block each (Nemotron-H's), not {blocks}")


def gated_rmsnorm(y, z, weight, group_size: int, eps: float = 1e-5):
    """Mamba-2's RMSNormGated (norm_before_gate=False): rmsnorm(y · silu(z)) per group of channels."""
    h = acc(y) * F.silu(acc(z))
    shape = h.shape
    hg = h.view(*shape[:-1], shape[-1] // group_size, group_size)
    hg = hg * torch.rsqrt(hg.pow(2).mean(-1, keepdim=True) + eps)
    return (hg.view(shape) * acc(weight)).to(y.dtype)


# The most elements one torch.cat in cat_last writes (the limit of torch's batched CUDA cat kernel).
CAT_BLOCK_ELEMENTS = 2**31 - 1


def cat_last(parts: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat(parts, -1) for tensors that agree in every dimension but the last, a block of rows at
    a time: past 2^31 elements torch's CUDA cat leaves its batched kernel for one strided copy per part
    (the in_proj output's gradient of mamba2-2.7b/2L at 512K tokens on one H200: 40.3 ms a step, against
    4.4 ms at 128K; benchmarks/results/sp-long-profile-512k-h200x2.json). Blocks of rows under 2^31
    elements keep every copy on the batched kernel."""
    lead = parts[0].shape[:-1]
    flat = [p.reshape(-1, p.shape[-1]) for p in parts]
    width = sum(p.shape[-1] for p in parts)
    out = torch.empty(flat[0].shape[0], width, device=parts[0].device, dtype=parts[0].dtype)
    step = max(1, CAT_BLOCK_ELEMENTS // width)
    for r0 in range(0, out.shape[0], step):
        torch.cat([p[r0 : r0 + step] for p in flat], dim=-1, out=out[r0 : r0 + step])
    return out.view(*lead, width)


class _SplitLast(torch.autograd.Function):
    """t.split(sizes, -1) whose backward joins the parts' gradients with cat_last (absent ones as zeros)."""

    @staticmethod
    def forward(ctx, t, sizes):
        ctx.sizes = sizes
        return t.split(sizes, dim=-1)

    @staticmethod
    def backward(ctx, *grads):
        ref = next(g for g in grads if g is not None)
        parts = [g if g is not None else ref.new_zeros(*ref.shape[:-1], n) for g, n in zip(grads, ctx.sizes)]
        return cat_last(parts), None  # autograd gives each part its output's dtype: the input's


def split_last(t: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, ...]:
    """t.split(sizes, -1); under autograd, the parts' gradients joined by cat_last."""
    if not (torch.is_grad_enabled() and t.requires_grad):
        return t.split(sizes, dim=-1)
    return _SplitLast.apply(t, sizes)


def _conv_scan_inputs(
    zxbcdt,
    conv_w,
    conv_b,
    dt_bias,
    a_log,
    dims,
    seq_idx=None,
    conv_state=None,
    conv_out: bool = False,
    conv_state_idx=None,
):
    """in_proj output → (x, dt, A, B, C) as the scan takes them (conv1d applied, dt softplus'd), and z;
    with `conv_out`, also the conv's output (b, s, channels), of which x, B and C are views.
    `conv_state_idx` (b, d_conv − 1): the packed sequence each conv_state column belongs to."""
    d_inner, ngroups, d_state, nheads, headdim = dims
    b, s, _ = zxbcdt.shape
    z, xbc, dt = split_last(zxbcdt, [d_inner, d_inner + 2 * ngroups * d_state, nheads])
    if xbc.is_cuda and (conv_state is None or conv_w.shape[1] <= 4):  # Triton; CPU keeps the reference
        from meshplan.kernels.conv1d import causal_conv1d

        xbc = causal_conv1d(xbc, conv_w, conv_b, seq_idx, initial_state=conv_state, initial_seq_idx=conv_state_idx)
    else:
        xbc = causal_conv1d_ref(
            xbc, conv_w, conv_b, seq_idx=seq_idx, initial_state=conv_state, initial_seq_idx=conv_state_idx
        )
    x, B, C = split_last(xbc, [d_inner, ngroups * d_state, ngroups * d_state])
    dt = F.softplus(acc(dt) + acc(dt_bias))
    scan_in = (
        x.reshape(b, s, nheads, headdim),
        dt,
        -torch.exp(acc(a_log)),
        B.reshape(b, s, ngroups, d_state),
        C.reshape(b, s, ngroups, d_state),
    )
    return (scan_in, z, xbc) if conv_out else (scan_in, z)


def _scan(x, dt, A, B, C, D=None, initial_state=None, seq_idx=None):
    if x.is_cuda:  # the Triton scan (forward and backward); CPU keeps the reference
        from meshplan.kernels.ssd_combined import ssd_chunked

        return ssd_chunked(x, dt, A, B, C, D, initial_state=initial_state, chunk=SSD_CHUNK, seq_idx=seq_idx)
    return ssd_chunked_ref(x, dt, A, B, C, D, initial_state=initial_state, chunk=SSD_CHUNK, seq_idx=seq_idx)


def _scan_grads(x, dt, A, B, C, D, dy, dfinal, seq_idx=None):
    """Gradients of the zero-start scan's (x, dt, A, B, C, D) from its output's and final state's
    gradients, with nothing of its forward kept: the Triton backward on the GPU (which recomputes what
    it needs from the inputs), autograd through the reference on the CPU."""
    if x.is_cuda:
        from meshplan.kernels.ssd_bwd import ssd_backward

        return ssd_backward(dy, dfinal, x, dt, A, B, C, D, None, seq_idx, SSD_CHUNK)[:6]
    leaves = [t.detach().requires_grad_(True) for t in (x, dt, A, B, C, D)]
    with torch.enable_grad():
        y, final = ssd_chunked_ref(*leaves, chunk=SSD_CHUNK, seq_idx=seq_idx)
        return torch.autograd.grad([y, final], leaves, [dy, dfinal])


def gated_norm(y, z, weight, group_size: int):
    """The gated RMSNorm: the Triton kernels on the GPU (nothing fp32 of the row's width kept), the
    torch reference on the CPU."""
    if y.is_cuda:
        from meshplan.kernels.gated_norm import gated_rmsnorm_triton

        return gated_rmsnorm_triton(y, z, weight, group_size)
    return gated_rmsnorm(y, z, weight, group_size)


def mamba2_mixer(
    zxbcdt,
    conv_w,
    conv_b,
    dt_bias,
    a_log,
    d_skip,
    norm_w,
    out_w,
    dims,
    seq_idx=None,
    initial_state=None,
    conv_state=None,
    norm=None,
):
    """in_proj output → conv1d → SSD scan → gated norm → out_proj. Returns (out, final_state).

    `conv_state` (b, conv channels, d_conv − 1) and `initial_state` continue a sequence from where a
    previous shard left it; `norm(y, z, weight)` replaces the gated RMSNorm (a distributed one for TP)."""
    d_inner, ngroups = dims[0], dims[1]
    b, s, _ = zxbcdt.shape
    scan_args, z = _conv_scan_inputs(zxbcdt, conv_w, conv_b, dt_bias, a_log, dims, seq_idx, conv_state)
    y, state = _scan(*scan_args, d_skip, initial_state=initial_state, seq_idx=seq_idx)
    y = y.reshape(b, s, d_inner)
    y = norm(y, z, norm_w) if norm is not None else gated_norm(y, z, norm_w, d_inner // ngroups)
    return F.linear(y, out_w), state


class Mamba2CoreFn(torch.autograd.Function):
    """The mixer core with recompute: saves only zxbcdt (the weights, and the small conv / SSM states a
    sequence shard starts from) for backward. Returns (out, final SSM state)."""

    @staticmethod
    def forward(
        ctx,
        zxbcdt,
        conv_state,
        init_state,
        conv_w,
        conv_b,
        dt_bias,
        a_log,
        d_skip,
        norm_w,
        out_w,
        dims,
        norm,
        seq_idx=None,
    ):
        with torch.no_grad():
            out, state = mamba2_mixer(
                zxbcdt,
                conv_w,
                conv_b,
                dt_bias,
                a_log,
                d_skip,
                norm_w,
                out_w,
                dims,
                seq_idx=seq_idx,
                initial_state=init_state,
                conv_state=conv_state,
                norm=norm,
            )
        ctx.dims, ctx.norm, ctx.seq_idx = dims, norm, seq_idx
        ctx.save_for_backward(zxbcdt, conv_state, init_state, conv_w, conv_b, dt_bias, a_log, d_skip, norm_w, out_w)
        return out, state

    @staticmethod
    def backward(ctx, grad_out, grad_state):
        saved = ctx.saved_tensors
        inputs = [t.detach().requires_grad_(True) if t is not None else None for t in saved]
        zx, conv_state, init_state, *params = inputs
        with torch.enable_grad():
            out, state = mamba2_mixer(
                zx,
                *params,
                ctx.dims,
                seq_idx=ctx.seq_idx,
                initial_state=init_state,
                conv_state=conv_state,
                norm=ctx.norm,
            )
        wrt = [t for t in inputs if t is not None]
        outputs, grads_out = [out], [grad_out]
        if grad_state is not None:
            outputs.append(state)
            grads_out.append(grad_state)
        grads = iter(torch.autograd.grad(outputs, wrt, grads_out, allow_unused=True))
        result = [next(grads) if t is not None else None for t in inputs]
        return (*result, None, None, None)


class Mamba2Block(nn.Module):
    """Pre-norm Mamba-2 block: RMSNorm → in_proj → mixer core (recomputed in backward) → residual."""

    def __init__(self, model: ModelSpec):
        super().__init__()
        m = model.mamba2
        self.dims = (m.d_inner, m.ngroups, m.d_state, m.nheads, m.headdim)
        self.norm = RMSNorm(m.d_model, model.norm_eps)
        self.in_proj = _init(m.in_proj_width, m.d_model)
        self.conv_w = nn.Parameter(torch.randn(m.conv_dim, m.d_conv) / math.sqrt(m.d_conv))
        self.conv_b = nn.Parameter(torch.zeros(m.conv_dim))
        self.dt_bias = nn.Parameter(torch.log(torch.expm1(torch.linspace(1e-3, 1e-1, m.nheads))))
        self.a_log = nn.Parameter(torch.log(torch.linspace(1.0, 16.0, m.nheads)))
        self.d_skip = nn.Parameter(torch.ones(m.nheads))
        self.norm_w = nn.Parameter(torch.ones(m.d_inner))
        self.out_proj = _init(m.d_model, m.d_inner)

    def forward(self, x, seq_idx=None):
        """`seq_idx` (b, s): packed sequences, each starting from a zero state and an empty conv window."""
        return x + self.mix(x, seq_idx)

    def mix(self, x, seq_idx=None):
        """What the block adds to the stream for input x: its norm, in_proj and mixer."""
        zxbcdt = F.linear(self.norm(x), self.in_proj)
        out, _ = Mamba2CoreFn.apply(
            zxbcdt,
            None,
            None,
            self.conv_w,
            self.conv_b,
            self.dt_bias,
            self.a_log,
            self.d_skip,
            self.norm_w,
            self.out_proj,
            self.dims,
            None,
            seq_idx,
        )
        return out


# Zamba2 (transformers' modeling_zamba2.py): Mamba-2 layers, some of which ("hybrid" layers) first run a
# shared transformer block — one of shared_blocks copies, used in turn — on concat(hidden, the token
# embeddings), with no residual inside it, and add its output, through the layer's own linear, to the
# Mamba-2 block's input (not to the stream: the block's residual is the layer's input).


def adapter_delta(xn: torch.Tensor, down: torch.Tensor, *ups: torch.Tensor) -> torch.Tensor:
    """A LoRA adapter's output for xn: xn through `down` (r·len(ups), in), each rank-r part through its
    `up` (out_i, r), the parts' outputs side by side (Zamba2's gate/up adapter: one up; its Q, K, V
    adapters: three, one a projection)."""
    u = F.linear(xn, down)
    if len(ups) == 1:
        return F.linear(u, ups[0])
    parts = u.split(u.shape[-1] // len(ups), dim=-1)
    return torch.cat([F.linear(p, up) for p, up in zip(parts, ups)], dim=-1)


class SharedBlock(DenseLayer):
    """Zamba2's shared transformer block (Zamba2AttentionDecoderLayer): RMSNorm of concat(hidden,
    embeddings) (2·d_model wide) → attention (heads of 2·d_model / heads, scores scaled by
    (head_dim / 2)^-½, rotary only with use_mem_rope) → W_O to d_model → RMSNorm → gated MLP; no
    residual. Each invocation brings its own adapters (a HybridLayer's)."""

    def __init__(self, model: ModelSpec, flash: bool = True):
        nn.Module.__init__(self)
        self._attention_weights(model, flash, False)
        self._mlp_weights(model)
        self.q_scale = math.sqrt(2.0)

    def forward(self, x, emb, layer: HybridLayer):
        a = self.attention(torch.cat([x, emb], dim=-1), layer.qkv_adapter)
        return self.mlp(a, layer.mlp_adapter)


class Adapters:
    """A Zamba2 invocation's LoRA adapters as the shared block takes them (None where it has none):
    `mlp_adapter` (down, up) on the MLP's [gate; up], `qkv_adapter` (down, q up, k up, v up) — read from
    the weights of that name its class holds (HybridLayer; its shard, layouts/hybrid.HybridProjection)."""

    @property
    def mlp_adapter(self):
        return (self.mlp_adapter_down, self.mlp_adapter_up) if hasattr(self, "mlp_adapter_down") else None

    @property
    def qkv_adapter(self):
        if not hasattr(self, "qkv_adapter_down"):
            return None
        return (self.qkv_adapter_down, self.q_adapter_up, self.k_adapter_up, self.v_adapter_up)


class HybridLayer(Adapters, Mamba2Block):
    """A Zamba2 hybrid layer (Zamba2HybridLayer): its shared block's output for (x, embeddings), through
    the layer's own linear, added to the Mamba-2 block's input; the stream's residual is x:
    x + mamba(norm(x + linear(block(x, emb)))). The layer owns its Mamba-2 weights, the linear and its
    adapters (mlp_adapter_*: on the MLP's [gate; up]; qkv_adapter_down, {q,k,v}_adapter_up: on QKV,
    with attention_adapters); the block (`block`, one of the Stack's `shared`) is referenced, not
    registered, so that its weights are the stack's once."""

    def __init__(self, model: ModelSpec, block: SharedBlock, copy: int):
        super().__init__(model)
        self.__dict__["block"] = block  # not a submodule: Stack.shared holds it
        self.copy = copy
        f, a, rank = model.mlp, model.attention, model.adapter_rank
        self.linear = _init(model.d_model, f.out_hidden)
        if rank:
            self.mlp_adapter_down = _init(rank, f.hidden)
            self.mlp_adapter_up = _init(f.n_input_matrices * f.ffn_hidden, rank)
        if rank and model.attention_adapters:
            self.qkv_adapter_down = _init(3 * rank, a.hidden)
            self.q_adapter_up = _init(a.q_width, rank)
            self.k_adapter_up = _init(a.kv_width, rank)
            self.v_adapter_up = _init(a.kv_width, rank)

    def forward(self, x, emb, seq_idx=None):
        t = F.linear(self.block(x, emb, self), self.linear)
        return x + self.mix(x + t, seq_idx)


class Stack(nn.Module):
    """`n_layers` repetition units of a dense or Mamba-2 model (a mixed model's first n_layers layers, in
    their order), with a recompute policy."""

    def __init__(self, model: ModelSpec, n_layers: int, recompute: str = "none", flash: bool = True):
        super().__init__()
        if model.family == "dense":
            make = lambda: DenseLayer(model, flash=flash, selective_recompute=recompute == "selective")  # noqa: E731
        elif model.family == "mamba2":
            make = lambda: Mamba2Block(model)  # noqa: E731
        elif model.family == "moe" and not model.dense_layer_ids:
            make = lambda: MoELayer(model, flash=flash, selective_recompute=recompute == "selective")  # noqa: E731
        elif model.family == "mixed":
            kinds = iter(model.layer_blocks())
            make = lambda: mixed_layer(model, next(kinds), flash, recompute == "selective")  # noqa: E731
        elif model.family == "hybrid":
            # Zamba2: the shared blocks held once, here; the k-th hybrid layer invokes copy k mod shared_blocks
            self.shared = nn.ModuleList(SharedBlock(model, flash) for _ in range(model.shared_blocks))
            layers = iter(hybrid_layers(model, self.shared))
            make = lambda: next(layers)  # noqa: E731
        else:
            raise ValueError(f"Stack supports dense, mamba2, all-MoE, mixed and hybrid models, not {model.family}")
        self.layers = nn.ModuleList(make() for _ in range(n_layers))
        self.recompute = recompute

    def forward(self, x, seq_idx=None):
        """`seq_idx` (b, s): packed documents, which the Mamba-2 blocks keep apart (attention does not).
        A hybrid layer reads the stack's input (the token embeddings) beside x."""
        emb = x
        for layer in self.layers:
            args = (x, seq_idx) if seq_idx is not None and isinstance(layer, Mamba2Block) else (x,)
            if isinstance(layer, HybridLayer):
                args = (x, emb, seq_idx)
            # Full recompute keeps only each layer's input (the reentrant form saves exactly that).
            x = checkpoint(layer, *args, use_reentrant=True) if self.recompute == "full" else layer(*args)
        return x


def hybrid_layers(model: ModelSpec, shared: nn.ModuleList) -> list[Mamba2Block]:
    """A Zamba2 model's layers in order: Mamba2Block, or at the hybrid layer ids a HybridLayer invoking
    the shared copies in turn (transformers' Zamba2Model.get_layers: copy k mod num_mem_blocks)."""
    copy = {i: k % len(shared) for k, i in enumerate(model._hybrid_ids())}
    return [
        HybridLayer(model, shared[copy[i]], copy[i]) if i in copy else Mamba2Block(model) for i in range(model.layers)
    ]

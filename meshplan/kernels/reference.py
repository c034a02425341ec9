"""Plain-torch references for the kernels: slow, obvious, and the ground truth in tests.

Shapes (Mamba-2 / mamba_ssm conventions):
    x  (batch, seqlen, nheads, headdim)      dt (batch, seqlen, nheads)    A (nheads,) negative
    B, C (batch, seqlen, ngroups, d_state)   D (nheads,)
    seq_idx (batch, seqlen) int: which packed sequence each token belongs to (state resets between).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def acc(t: torch.Tensor) -> torch.Tensor:
    """`t` in its accumulation dtype: fp32 for bf16/fp16/fp32, float64 stays float64 (for checks)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def swiglu_ref(h: torch.Tensor) -> torch.Tensor:
    """SwiGLU of h (…, 2f) = [gate | up]: silu(gate) · up (…, f), as transformers' Llama MLP computes it."""
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def swiglu_grad_ref(h: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """h's gradient (…, 2f) through swiglu_ref from the output's gradient: [grad · up · silu'(gate) |
    grad · silu(gate)], silu'(x) = σ(x)·(1 + x·(1 − σ(x))), in the accumulation dtype, rounded to h's."""
    gate, up = acc(h).chunk(2, dim=-1)
    g, sig = acc(grad), torch.sigmoid(gate)
    return torch.cat([g * up * sig * (1 + gate * (1 - sig)), g * gate * sig], dim=-1).to(h.dtype)


def causal_conv1d_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    activation: str | None = "silu",
    initial_seq_idx: torch.Tensor | None = None,
) -> torch.Tensor:
    """Depthwise causal conv over time. x (b, s, c), weight (c, k), initial_state (b, c, k-1).

    With `seq_idx`, a token never sees taps from an earlier packed sequence. `initial_seq_idx` (b, k-1):
    the sequence of each initial_state column (a previous shard's tail); without it they belong to none.
    """
    b, s, c = x.shape
    k = weight.shape[1]
    pad = x.new_zeros(b, k - 1, c) if initial_state is None else initial_state.transpose(1, 2).to(x.dtype)
    xp = torch.cat([pad, x], dim=1)  # (b, s + k - 1, c)
    out = torch.zeros(b, s, c, dtype=acc(x).dtype, device=x.device)
    if seq_idx is not None:
        before = seq_idx.new_full((b, k - 1), -1) if initial_seq_idx is None else initial_seq_idx.to(seq_idx.dtype)
        padded_idx = torch.cat([before, seq_idx], dim=1)  # the sequence of each column of xp
    for tap in range(k):
        # output t uses input t - (k - 1 - tap)
        shift = k - 1 - tap
        contrib = acc(xp[:, tap : tap + s, :]) * acc(weight[:, tap])
        if seq_idx is not None and shift > 0:
            contrib = contrib * (padded_idx[:, tap : tap + s] == seq_idx).unsqueeze(-1)
        out = out + contrib
    if bias is not None:
        out = out + acc(bias)
    if activation == "silu":
        out = F.silu(out)
    return out.to(x.dtype)


def ssd_scan_ref(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Mamba-2 recurrence, token by token, in fp32:

        h_t = exp(dt_t · A) · h_{t-1} + dt_t · x_t ⊗ B_t      y_t = h_t · C_t + D · x_t

    `dt` is used as given (softplus and bias applied by the caller). Returns y (like x) and the final
    state (batch, nheads, headdim, d_state). Where seq_idx changes, the state restarts from zero.
    """
    b, s, h, p = x.shape
    g = B.shape[2]
    heads_per_group = h // g
    state = (
        x.new_zeros(b, h, p, B.shape[-1], dtype=acc(x).dtype) if initial_state is None else acc(initial_state).clone()
    )
    Bh = acc(B).repeat_interleave(heads_per_group, dim=2)  # (b, s, h, n)
    Ch = acc(C).repeat_interleave(heads_per_group, dim=2)
    ys = []
    for t in range(s):
        if seq_idx is not None and t > 0:
            keep = (seq_idx[:, t] == seq_idx[:, t - 1]).float().view(b, 1, 1, 1)
            state = state * keep
        dt_t = acc(dt[:, t])  # (b, h)
        decay = torch.exp(dt_t * acc(A)).view(b, h, 1, 1)
        state = state * decay + (dt_t.view(b, h, 1, 1) * acc(x[:, t]).unsqueeze(-1)) * Bh[:, t].unsqueeze(2)
        y_t = (state * Ch[:, t].unsqueeze(2)).sum(-1)  # (b, h, p)
        if D is not None:
            y_t = y_t + acc(D).view(1, h, 1) * acc(x[:, t])
        ys.append(y_t)
    return torch.stack(ys, dim=1).to(x.dtype), state


def _segsum(a: torch.Tensor) -> torch.Tensor:
    """(..., l) → (..., l, l): sum of a[j+1..i] below the diagonal, 0 on it, -inf above."""
    n = a.shape[-1]
    cs = torch.cumsum(a, dim=-1)
    out = cs[..., :, None] - cs[..., None, :]
    keep = torch.ones(n, n, dtype=torch.bool, device=a.device).tril()
    return out.masked_fill(~keep, float("-inf"))


def ssd_chunked_ref(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    chunk: int = 64,
    seq_idx: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same recurrence as `ssd_scan_ref`, computed chunk by chunk with matmuls (the SSD
    decomposition of Dao & Gu 2024, §6): quadratic attention-like form inside each chunk, the
    recurrence between chunks on their final states.

    With `seq_idx` (non-decreasing along each row) no state crosses a sequence boundary: inside a
    chunk, pairs from different sequences are masked; a chunk's own state counts only the tokens of
    its last sequence; the state entering a chunk reaches only tokens of the sequence it came from,
    and is dropped where a boundary falls before the chunk's end. `initial_state` belongs to each
    row's first sequence."""
    if seq_idx is not None:
        return _ssd_chunked_packed(x, dt, A, B, C, D, initial_state, chunk, seq_idx)
    b, s, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    pad = (-s) % chunk
    dtype = acc(x).dtype
    xa, dta = acc(x), acc(dt)
    Bh = acc(B).repeat_interleave(h // g, dim=2)
    Ch = acc(C).repeat_interleave(h // g, dim=2)
    if pad:  # dt = 0 on padding: no decay, no input — the state passes through unchanged
        xa, dta, Bh, Ch = (F.pad(t, (0,) * (2 * (t.dim() - 2)) + (0, pad)) for t in (xa, dta, Bh, Ch))
    c = (s + pad) // chunk
    X = (xa * dta.unsqueeze(-1)).view(b, c, chunk, h, p)
    a = (dta * acc(A)).view(b, c, chunk, h).permute(0, 3, 1, 2)  # (b, h, c, l)
    Bc, Cc = Bh.view(b, c, chunk, h, n), Ch.view(b, c, chunk, h, n)
    a_cum = torch.cumsum(a, dim=-1)
    # 1. within each chunk
    L = torch.exp(_segsum(a))  # (b, h, c, l, l)
    scores = torch.einsum("bclhn,bcshn->bhcls", Cc, Bc) * L
    y = torch.einsum("bhcls,bcshp->bclhp", scores, X)
    # 2. each chunk's final state from its own inputs
    decay_to_end = torch.exp(a_cum[..., -1:] - a_cum)  # (b, h, c, l)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bc, decay_to_end, X)
    # 3. the recurrence across chunks
    init = torch.zeros_like(states[:, :1]) if initial_state is None else acc(initial_state).unsqueeze(1).to(dtype)
    states = torch.cat([init, states], dim=1)  # (b, c + 1, h, p, n)
    chunk_decay = torch.exp(_segsum(F.pad(a_cum[..., -1], (1, 0))))  # (b, h, c + 1, c + 1)
    states = torch.einsum("bhzc,bchpn->bzhpn", chunk_decay, states)
    entering, final = states[:, :-1], states[:, -1]
    # 4. what the state entering each chunk adds to its outputs
    y = y + torch.einsum("bclhn,bchpn,bhcl->bclhp", Cc, entering, torch.exp(a_cum))
    y = y.reshape(b, c * chunk, h, p)[:, :s]
    if D is not None:
        y = y + acc(D).view(1, 1, h, 1) * acc(x)
    return y.to(x.dtype), final


def entering_state_ref(y0: torch.Tensor, C: torch.Tensor, cum: torch.Tensor, E: torch.Tensor) -> torch.Tensor:
    """A sequence shard's zero-start scan output y0 (b, s, h, p) corrected for the state E (b, h, p, n)
    entering it: y0 + exp(cum) · C_t · E_h per head, with C (b, s, g, n) shared by a group's heads and
    cum (b, s, h) = Σ_{k ≤ t} dt_k · A_h. C · E takes C's dtype (bf16 on the GPU, as the Triton scan's
    entering states are stored) and the sum y0's."""
    b, s, h, p = y0.shape
    g, n = C.shape[2], C.shape[3]
    ce = torch.einsum("bsgn,bgqpn->bsgqp", C, E.to(C.dtype).view(b, g, h // g, p, n)).reshape(b, s, h, p)
    # One pass over y: y0 + C·E · exp(cum), the factor rounded to C·E's dtype (exact in fp32 / fp64).
    return torch.addcmul(y0, ce, torch.exp(cum).to(ce.dtype)[..., None])


def quantize_int8_ref(x: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per group of `group` consecutive elements: scale = max|x| / 127 (1 where a
    group is all zeros), q = round(x / scale). x.numel() must be a multiple of `group`."""
    g = acc(x).reshape(-1, group)
    scale = g.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).to(torch.float32)
    q = torch.clamp(torch.round(g / scale[:, None]), -127, 127).to(torch.int8)
    return q.reshape(-1), scale


def dequantize_int8_ref(
    q: torch.Tensor, scale: torch.Tensor, group: int = 128, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    return (q.reshape(-1, group).to(torch.float32) * scale[:, None]).reshape(-1).to(dtype)


def selective_state_update_ref(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decode step of the Mamba-2 recurrence, state updated in place.

    state (b, h, p, n) fp32; x (b, h, p); dt (b, h) after softplus; A (h,); B, C (b, g, n).
    Returns y (b, h, p) = (state' · C) + D·x with state' = exp(dt·A)·state + dt·x ⊗ B."""
    b, h, p = x.shape
    rep = h // B.shape[1]
    Bh, Ch = acc(B).repeat_interleave(rep, 1), acc(C).repeat_interleave(rep, 1)  # (b, h, n)
    dta = acc(dt)
    new = state * torch.exp(dta * acc(A)).view(b, h, 1, 1) + (dta.view(b, h, 1) * acc(x)).unsqueeze(-1) * Bh.unsqueeze(
        2
    )
    state.copy_(new)
    y = (new * Ch.unsqueeze(2)).sum(-1)
    if D is not None:
        y = y + acc(D).view(1, h, 1) * acc(x)
    return y.to(x.dtype)


def _ssd_chunked_packed(x, dt, A, B, C, D, initial_state, chunk, seq_idx):
    b, s, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    pad = (-s) % chunk
    xa, dta = acc(x), acc(dt)
    Bh = acc(B).repeat_interleave(h // g, dim=2)
    Ch = acc(C).repeat_interleave(h // g, dim=2)
    sid = seq_idx.to(torch.int64)
    if pad:
        xa, dta, Bh, Ch = (F.pad(t, (0,) * (2 * (t.dim() - 2)) + (0, pad)) for t in (xa, dta, Bh, Ch))
        sid = torch.cat([sid, sid[:, -1:].expand(b, pad)], dim=1)  # padding joins the last sequence (dt = 0)
    c = (s + pad) // chunk
    X = (xa * dta.unsqueeze(-1)).view(b, c, chunk, h, p)
    a = (dta * acc(A)).view(b, c, chunk, h).permute(0, 3, 1, 2)  # (b, h, c, l)
    Bc, Cc = Bh.view(b, c, chunk, h, n), Ch.view(b, c, chunk, h, n)
    sc = sid.view(b, c, chunk)
    a_cum = torch.cumsum(a, dim=-1)
    same = (sc.unsqueeze(-1) == sc.unsqueeze(-2)).unsqueeze(1)  # (b, 1, c, l, l)
    L = torch.exp(_segsum(a)) * same
    y = torch.einsum("bhcls,bcshp->bclhp", torch.einsum("bclhn,bcshn->bhcls", Cc, Bc) * L, X)
    last = sc[:, :, -1:]  # (b, c, 1)
    own = (sc == last).permute(0, 1, 2).unsqueeze(1)  # (b, 1, c, l): tokens of the chunk's last sequence
    decay_to_end = torch.exp(a_cum[..., -1:] - a_cum) * own
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bc, decay_to_end, X)  # (b, c, h, p, n)
    carried = torch.zeros_like(states[:, 0]) if initial_state is None else acc(initial_state).to(states.dtype).clone()
    prev_end = sc[:, 0, 0]  # the sequence the carried state belongs to
    chunk_decay = torch.exp(a_cum[..., -1])  # (b, h, c)
    y_off = torch.zeros_like(y)
    for k in range(c):
        reach = (sc[:, k] == prev_end[:, None]).to(y.dtype)  # (b, l)
        y_off[:, k] = (
            torch.einsum("blhn,bhpn,bhl->blhp", Cc[:, k], carried, torch.exp(a_cum[:, :, k])) * reach[:, :, None, None]
        )
        keep = (sc[:, k, -1] == prev_end).to(y.dtype).view(b, 1, 1, 1)  # no boundary up to this chunk's end
        carried = states[:, k] + chunk_decay[:, :, k].view(b, h, 1, 1) * carried * keep
        prev_end = sc[:, k, -1]
    y = (y + y_off).reshape(b, c * chunk, h, p)[:, :s]
    if D is not None:
        y = y + acc(D).view(1, 1, h, 1) * acc(x)
    return y.to(x.dtype), carried


def causal_conv1d_update_ref(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
) -> torch.Tensor:
    """One decode step of the causal conv: x (b, c), conv_state (b, K−1, c) the previous K−1 inputs
    (oldest first), updated in place. Equals the last output of causal_conv1d_ref over (state, x)."""
    window = torch.cat([conv_state, x.unsqueeze(1)], dim=1)  # (b, K, c)
    out = (acc(window) * acc(weight).t().unsqueeze(0)).sum(1)
    if bias is not None:
        out = out + acc(bias)
    if activation == "silu":
        out = F.silu(out)
    conv_state.copy_(window[:, 1:])
    return out.to(x.dtype)


def packed_chunk_bytes(chunk: int, group: int = 128) -> int:
    """Bytes of one packed int8 chunk: `chunk` int8 values, then one fp32 scale per group."""
    return chunk + 4 * (chunk // group)


def quantize_int8_packed_ref(x: torch.Tensor, parts: int, group: int = 128) -> torch.Tensor:
    """x (numel a multiple of parts · group) → (parts, chunk bytes) uint8: part j holds the int8 values
    of x's j-th slice followed by their fp32 scales' bytes — one buffer per destination, so a quantized
    all-reduce needs one all-to-all and one all-gather instead of two of each."""
    q, s = quantize_int8_ref(x, group)
    return torch.cat([q.view(torch.uint8).view(parts, -1), s.view(torch.uint8).view(parts, -1)], dim=1)


def unpack_int8_ref(buf: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, chunk bytes) uint8 → (rows, chunk) int8 values and (rows, chunk / group) fp32 scales."""
    rows, nbytes = buf.shape
    chunk = nbytes * group // (group + 4)
    return buf[:, :chunk].contiguous().view(torch.int8), buf[:, chunk:].contiguous().view(torch.float32)


def dequant_sum_requant_ref(buf: torch.Tensor, group: int = 128) -> torch.Tensor:
    """(n, chunk bytes) packed copies of one slice from n ranks → their fp32 sum, re-quantized and
    packed as one (chunk bytes,) row."""
    return quantize_int8_packed_ref(dequant_sum_ref(buf, group), 1, group)[0]


def dequant_sum_ref(buf: torch.Tensor, group: int = 128, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(n, chunk bytes) packed copies of one tensor from n ranks → their fp32 sum, in `dtype`."""
    q, s = unpack_int8_ref(buf, group)
    return (q.view(q.shape[0], -1, group).to(torch.float32) * s[:, :, None]).sum(0).reshape(-1).to(dtype)


def dequantize_packed_ref(buf: torch.Tensor, group: int = 128, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(rows, chunk bytes) packed → the rows' values, concatenated, in `dtype`."""
    q, s = unpack_int8_ref(buf, group)
    return (q.view(q.shape[0], -1, group).to(torch.float32) * s[:, :, None]).reshape(-1).to(dtype)


def adam_step_ref(
    w: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    grad: torch.Tensor,
    out: torch.Tensor,
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    step: int,
) -> None:
    """One Adam step (AdamW with weight decay 0: Loshchilov & Hutter 2019, Algorithm 2) on one parameter,
    in place: the fp32 master weight w and moments m, v (one shape) from `grad` (w's shape, any float
    dtype), then the flat `out` (the parameter's dtype, w's length) ← w. The arithmetic torch.optim.AdamW's
    single-tensor path does, which optim.MixedAdam runs off the GPU:
        m ← b1·m + (1 − b1)·g;  v ← b2·v + (1 − b2)·g²;  w ← w − lr/(1 − b1^t) · m / (√v / √(1 − b2^t) + eps)."""
    b1, b2 = betas
    c1, c2 = 1 - b1**step, 1 - b2**step
    g = grad.float()
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    w.addcdiv_(m, v.sqrt().div_(c2**0.5).add_(eps), value=-lr / c1)
    out.copy_(w.reshape(-1))

"""A rank's experts over the token copies routed to them, as one grouped GEMM a projection.

The copies are laid out by expert in one buffer (Groups) and each projection of every expert runs as one
launch: torch._grouped_mm on a GPU that has it (CUDA, bf16, compute capability 9.0 and up) — the way MoE
training runs its experts (Megatron-Core's grouped GEMM, torchtitan's _run_experts_grouped_mm) and the
way the cost model prices them (meshplan.costmodel.device grouped_gemm_time_s, measured with
torch._grouped_mm: benchmarks/results/grouped-gemm-h100.json); a plain-torch loop over the groups
elsewhere (CPU, the tests' gloo ranks), on the same layout.

The grouped kernel's backward splits the weight gradient along the rows, which needs each expert's rows
to start 16 bytes apart: the groups are padded with zero rows to a multiple of ALIGN (torchtitan pads the
same way: TOKEN_GROUP_ALIGN_SIZE_M). Zero rows add nothing to any gradient and their outputs are dropped.
The copies move in and out of that layout by gathers both ways (Take), never by an atomic scatter-add.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from meshplan.kernels.reference import swiglu_grad_ref, swiglu_ref

ALIGN = 8  # rows: 16 bytes of bf16 (torch._grouped_mm's operand alignment)


def grouped_mm_ok(x: torch.Tensor) -> bool:
    """Whether torch._grouped_mm runs these rows: a CUDA bf16 tensor on compute capability 9.0+."""
    return (
        hasattr(torch, "_grouped_mm")
        and x.is_cuda
        and x.dtype == torch.bfloat16
        and torch.cuda.get_device_capability(x.device)[0] >= 9
    )


class Take(torch.autograd.Function):
    """rows = x[index], the rows where `blank` is set zeroed; its backward gathers too — x's gradient is
    the gradient's rows at `back`, summed over each x row's `fold` consecutive copies, zeroed where
    `blank_back` is set — so no routed copy goes through an atomic scatter-add (index_select's
    backward, index_add, serialises on a token's copies)."""

    @staticmethod
    def forward(ctx, x, index, back, fold=1, blank=None, blank_back=None):
        out = _rows(x, index)
        if blank is not None:
            out.masked_fill_(blank.unsqueeze(1), 0)
        ctx.save_for_backward(back, blank_back)
        ctx.fold = fold
        return out

    @staticmethod
    def backward(ctx, grad):
        back, blank_back = ctx.saved_tensors
        g = _rows(grad, back)
        if ctx.fold > 1:
            g = g.view(-1, ctx.fold, g.shape[1]).sum(1)
        if blank_back is not None:
            g = g.masked_fill(blank_back.unsqueeze(1), 0)
        return g, None, None, None, None, None


def _rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x[index]; zeros where x has no rows (a rank whose experts no copy reached: every place it
    lays out is padding)."""
    return x.index_select(0, index) if x.shape[0] else x.new_zeros(index.shape[0], *x.shape[1:])


def take(x, index, back, fold: int = 1, blank=None, blank_back=None) -> torch.Tensor:
    """Take.apply with every argument given (autograd wants a gradient slot for each)."""
    return Take.apply(x, index, back, fold, blank, blank_back)


@dataclass(frozen=True)
class Groups:
    """n rows laid out by group in a buffer whose groups are padded to ALIGN rows: `slot` (n,) each
    row's place, `src` (P,) the row each place holds (0 in padding), `pad` (P,) the padding, `offs`
    (G,) int32 the padded groups' ends. P is its bound n + G·(ALIGN − 1), known without asking the GPU."""

    slot: torch.Tensor
    src: torch.Tensor
    pad: torch.Tensor
    offs: torch.Tensor


def counts_of(group_of: torch.Tensor, groups: int) -> torch.Tensor:
    """The rows of each of `groups` groups, (groups,) int64, as a scatter-add of ones, which leaves the
    host free: CUDA's torch.bincount reads its input's minimum and maximum back to size its output, a
    host synchronisation each call — once a MoE layer's forward, after which the GPU waited on the host
    to issue the rest (integer adds: the counts are exact in any order)."""
    ones = torch.ones_like(group_of)
    return torch.zeros(groups, dtype=group_of.dtype, device=group_of.device).scatter_add_(0, group_of, ones)


def groups_of(group_of: torch.Tensor, groups: int, align: int = ALIGN) -> Groups:
    """Groups for rows whose groups are `group_of` (n,), in their own order within a group."""
    n, dev = group_of.numel(), group_of.device
    counts = counts_of(group_of, groups)
    padded = (counts + align - 1) // align * align
    ends = padded.cumsum(0)
    order = torch.argsort(group_of, stable=True)
    g = group_of.index_select(0, order)
    place = (
        (ends - padded).index_select(0, g)
        + torch.arange(n, device=dev)
        - (counts.cumsum(0) - counts).index_select(0, g)
    )
    slot = torch.empty_like(order).index_copy_(0, order, place)
    size = n + groups * (align - 1)
    src = torch.zeros(size, dtype=torch.long, device=dev).index_copy_(0, slot, torch.arange(n, device=dev))
    pad = torch.ones(size, dtype=torch.bool, device=dev).index_fill_(0, slot, False)
    return Groups(slot, src, pad, ends.to(torch.int32))


def _swiglu_kernel(h: torch.Tensor) -> bool:
    """Whether the Triton SwiGLU runs h: a CUDA tensor it computes in fp32 (not float64)."""
    return h.is_cuda and h.dtype in (torch.bfloat16, torch.float16, torch.float32)


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) · up of h (…, 2f) = [gate | up], outside autograd: one Triton pass on the GPU
    (meshplan.kernels.swiglu), the torch reference elsewhere."""
    if _swiglu_kernel(h):
        from meshplan.kernels.swiglu import swiglu_fwd

        return swiglu_fwd(h)
    return swiglu_ref(h)


def swiglu_grad(h: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """h's gradient (…, 2f) through swiglu from the output's gradient, recomputing silu(gate) from h."""
    if _swiglu_kernel(h):
        from meshplan.kernels.swiglu import swiglu_bwd

        return swiglu_bwd(h, grad)
    return swiglu_grad_ref(h, grad)


class SwiGLUFn(torch.autograd.Function):
    """SwiGLU keeping only its input h = [gate; up] for backward — not silu(gate), which autograd
    through silu and a product would keep beside it (f more bytes of activation dtype a row); the
    down projection keeps the output. What the cost model counts (costmodel/blocks/mlp.py, moe.py:
    gate, up and the product)."""

    @staticmethod
    def forward(ctx, h):
        ctx.save_for_backward(h)
        return swiglu(h)

    @staticmethod
    def backward(ctx, grad):
        (h,) = ctx.saved_tensors
        return swiglu_grad(h, grad)


def activate(h: torch.Tensor, gated: bool = True) -> torch.Tensor:
    """An expert's activation of its input projection h: SwiGLU of h's [gate; up] halves where `gated`
    (SwiGLUFn), else the squared ReLU of Nemotron-H's ungated experts (transformers' ACT2FN["relu2"]:
    relu(h)²)."""
    if gated:
        return SwiGLUFn.apply(h)
    return torch.square(F.relu(h))


def experts_mlp(
    buf: torch.Tensor, offs: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, mm=None, gated: bool = True
):
    """Each group of rows of `buf` (P, h) — rows up to offs[0], then to offs[1], … — through its expert:
    [gate; up] (E, 2f, h) — up alone (E, f, h) when not `gated` —, down (E, h, f); rows past the last
    group are left undefined. `mm`: the grouped GEMM (torch._grouped_mm where it runs, else
    reference_grouped_mm)."""
    mm = mm or (torch._grouped_mm if grouped_mm_ok(buf) else reference_grouped_mm)
    h = mm(buf, w_gate_up.transpose(-2, -1), offs=offs)
    return mm(activate(h, gated), w_down.transpose(-2, -1), offs=offs)


def routed_experts(
    x: torch.Tensor, group_of: torch.Tensor, groups: int, w_gate_up, w_down, fold: int = 1, mm=None, gated=True
):
    """Rows x (n/fold, h), each taken `fold` times (a token's routed copies, copy c of row c // fold),
    copy c through expert group_of[c]: the outputs (n, h) in copy order, the experts run as one grouped
    GEMM a projection on rows laid out by expert (Groups)."""
    g = groups_of(group_of, groups)
    buf = take(x, g.src // fold, g.slot, fold, g.pad)
    out = experts_mlp(buf, g.offs, w_gate_up, w_down, mm, gated)
    return take(out, g.slot, g.src, blank_back=g.pad)


def expert_mlp(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, gated: bool = True) -> torch.Tensor:
    """One expert on its tokens x (n, h): [gate; up] (2f, h) — up (f, h) when not `gated` —, down (h, f)."""
    return F.linear(activate(F.linear(x, w_gate_up), gated), w_down)


def reference_grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """torch._grouped_mm's 2-D × 3-D case in plain torch: rows [offs[g−1], offs[g]) of `a` times b[g]
    (rows past the last group: zeros)."""
    outs, start = [], 0
    for g, end in enumerate(offs.tolist()):
        outs.append(a[start:end] @ b[g])
        start = end
    outs.append(a.new_zeros(a.shape[0] - start, b.shape[-1]))
    return torch.cat(outs)

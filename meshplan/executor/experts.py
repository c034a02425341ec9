"""A rank's local experts over the token copies routed to them, as one grouped GEMM a projection.

Rows arrive sorted by expert (`counts[e]` rows for local expert e). On a GPU that has it (CUDA, bf16,
compute capability 9.0 and up: torch._grouped_mm's kernels) each projection of every expert is one
launch — the way MoE training runs its experts (Megatron-Core's grouped GEMM, torchtitan's
_run_experts_grouped_mm) and the way the cost model prices them (meshplan.costmodel.device
grouped_gemm_time_s, measured with torch._grouped_mm: benchmarks/results/grouped-gemm-h100.json).
Elsewhere (CPU, the tests' gloo ranks) one GEMM an expert.

The grouped kernel's backward splits the weight gradient along the rows, which needs each expert's
rows to start 16 bytes apart; the rows are laid into a buffer whose groups are padded with zero rows to
a multiple of ALIGN (torchtitan pads the same way: TOKEN_GROUP_ALIGN_SIZE_M). Zero rows add nothing to
any gradient and their outputs are dropped.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ALIGN = 8  # rows: 16 bytes of bf16 (torch._grouped_mm's operand alignment)


def grouped_mm_ok(x: torch.Tensor) -> bool:
    """Whether torch._grouped_mm runs these rows: a CUDA bf16 tensor on compute capability 9.0+."""
    return (
        hasattr(torch, "_grouped_mm")
        and x.is_cuda
        and x.dtype == torch.bfloat16
        and torch.cuda.get_device_capability(x.device)[0] >= 9
    )


def experts_mlp(x: torch.Tensor, counts: list[int], w_gate_up: torch.Tensor, w_down: torch.Tensor, mm=None):
    """Rows x (n, h) sorted by expert, `counts[e]` of them for expert e, each through its SwiGLU expert:
    [gate; up] (E, 2f, h), down (E, h, f). `mm`: the grouped GEMM (torch._grouped_mm where it runs;
    a test passes a reference); None picks it, or one GEMM an expert where it does not run."""
    if mm is None and not grouped_mm_ok(x):
        return _looped(x, counts, w_gate_up, w_down)
    mm = mm or torch._grouped_mm
    padded = [-(-c // ALIGN) * ALIGN for c in counts]
    starts, at = [], 0
    for p in padded:
        starts.append(at)
        at += p
    # Where each row goes in the padded buffer: its expert's padded start plus its place among that expert's rows.
    place = torch.cat(
        [torch.arange(s, s + c, device=x.device) for s, c in zip(starts, counts)]
        or [torch.empty(0, dtype=torch.long, device=x.device)]
    )
    buf = x.new_zeros(at, x.shape[1]).index_copy(0, place, x)
    offs = torch.tensor([s + p for s, p in zip(starts, padded)], dtype=torch.int32, device=x.device)
    gate, up = mm(buf, w_gate_up.transpose(-2, -1), offs=offs).chunk(2, dim=-1)
    out = mm(F.silu(gate) * up, w_down.transpose(-2, -1), offs=offs)
    return out.index_select(0, place)


def expert_mlp(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """One SwiGLU expert on its tokens x (n, h): [gate; up] (2f, h), down (h, f)."""
    gate, up = F.linear(x, w_gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, w_down)


def _looped(x, counts, w_gate_up, w_down):
    outs, at = [], 0
    for e, c in enumerate(counts):
        outs.append(expert_mlp(x[at : at + c], w_gate_up[e], w_down[e]))
        at += c
    return torch.cat(outs) if outs else x.new_zeros(0, w_down.shape[1])


def reference_grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """torch._grouped_mm's 2-D × 3-D case in plain torch: rows [offs[g−1], offs[g]) of `a` times b[g]."""
    outs, start = [], 0
    for g, end in enumerate(offs.tolist()):
        outs.append(a[start:end] @ b[g])
        start = end
    return torch.cat(outs)

"""The Mamba-2 side of benchmarks/peers.py (issue #34): mamba_ssm's own Triton kernels as the peer of
meshplan's SSD scan and Mamba-2 block, and the check that each pair computes the same thing.

mamba_ssm is not installed on the GPU machine (and needs CUDA extensions at its top-level import):
benchmarks/vendor_mamba_ssm.py copies its Triton files into benchmarks/third_party/, whence `load`
imports them. Two peers:

- the scan as each library's Mamba-2 block calls it. mamba_ssm's Mamba2 (its path without causal_conv1d)
  hands `mamba_chunk_scan_combined` the raw dt of in_proj with dt_bias and dt_softplus=True (the bias and
  softplus inside its cumsum kernel), A = −exp(A_log) in fp32, D, no z; meshplan's Mamba2Block adds the
  bias and takes the softplus in fp32 torch before its scan (meshplan.executor.blocks._conv_scan_inputs),
  which then gets fp32 dt and A. Both sides are timed from the same leaves (x, B, C and the raw dt in the
  activations' dtype; dt_bias, A_log, D in fp32), those torch steps included on meshplan's side.
- PeerMamba2Block: meshplan's Mamba2Block (pre-norm → in_proj → causal depthwise conv1d + SiLU → scan →
  gated RMSNorm → out_proj → residual) composed as mamba_ssm's Mamba2 runs it without causal_conv1d:
  nn.Linear in_proj, nn.Conv1d (padding d_conv − 1, the tail cut) + SiLU, `mamba_chunk_scan_combined`,
  its Triton RMSNormGated (`rmsnorm_fn`, norm_before_gate=False, one group per ngroups), nn.Linear
  out_proj; the pre-norm is mamba_ssm's Triton `rms_norm_fn` (what its Block's norm runs) and the residual
  a torch add. It saves what autograd saves; meshplan's block recomputes its mixer in backward.

On the CPU (peers.py --smoke) the kernels run under TRITON_INTERPRET=1 with three stand-ins (`load`):
one autotune config a kernel (the interpreter cannot time configs), and torch.cuda.device /
get_device_properties answered for CPU tensors.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from meshplan.executor.blocks import Mamba2Block
from meshplan.kernels.launch import SSD_CHUNK
from meshplan.kernels.reference import acc
from meshplan.models import Mamba2Spec, ModelSpec

THIRD_PARTY = Path(__file__).resolve().parent / "third_party"
PEER = "mamba_ssm"
# Each pair agrees when every compared tensor is within this norm-relative error of its peer: bf16
# rounding of two chunkings leaves ~1e-2 at most; a different function leaves O(1).
AGREE_REL_ERR = 5e-2


def load(cpu: bool) -> types.SimpleNamespace | str:
    """mamba_ssm's kernels from benchmarks/third_party: chunk_scan (mamba_chunk_scan_combined),
    gated_rmsnorm (layernorm_gated.rmsnorm_fn), rmsnorm (layer_norm.rms_norm_fn), version and commit; or
    a line saying why they cannot run here."""
    root = THIRD_PARTY / "mamba_ssm"
    if not (root / "ops" / "triton" / "ssd_combined.py").is_file():
        return f"no mamba_ssm in {THIRD_PARTY} (python benchmarks/vendor_mamba_ssm.py writes it)"
    if cpu:
        if os.environ.get("TRITON_INTERPRET") != "1":
            return "mamba_ssm's kernels need TRITON_INTERPRET=1 on the CPU"
        _cpu_stand_ins()
    if str(THIRD_PARTY) not in sys.path:
        sys.path.insert(0, str(THIRD_PARTY))
    try:
        from mamba_ssm.ops.triton.layer_norm import rms_norm_fn
        from mamba_ssm.ops.triton.layernorm_gated import rmsnorm_fn
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception as e:  # einops or packaging missing, a copy of another layout, a Triton it predates
        return f"the vendored mamba_ssm does not import: {type(e).__name__}: {e}"
    meta = json.loads((root / "SOURCE.json").read_text()) if (root / "SOURCE.json").is_file() else {}
    return types.SimpleNamespace(
        chunk_scan=mamba_chunk_scan_combined,
        gated_rmsnorm=rmsnorm_fn,
        rmsnorm=rms_norm_fn,
        version=meta.get("version"),
        commit=meta.get("commit"),
    )


def _cpu_stand_ins() -> None:
    """What mamba_ssm's launchers ask of CUDA, answered for CPU tensors under the interpreter."""
    os.environ["MAMBA_DETERMINISTIC"] = "1"  # its autotune lists cut to one config (read at import)
    real_device = torch.cuda.device
    torch.cuda.device = lambda index: contextlib.nullcontext() if index is None else real_device(index)
    torch.cuda.get_device_properties = lambda device=None: types.SimpleNamespace(
        multi_processor_count=4, name="cpu", gcnArchName=""
    )


# ---- the scan ----------------------------------------------------------------------------------------

SCAN_LEAVES = ("x", "dt", "B", "C", "dt_bias", "A_log", "D")


def scan_inputs(m: Mamba2Spec, seq: int, device: str, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    """The scan's leaves for one sequence, as in_proj and the conv hand them over: x (1, s, heads, headdim),
    dt (1, s, heads) before its bias and softplus, B and C (1, s, ngroups, d_state) in `dtype`; dt_bias and
    A_log as Mamba2Block initializes them, D random, in fp32."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, device=device, generator=gen).to(dtype)

    h = m.nheads
    return [
        t.requires_grad_()
        for t in (
            rand(1, seq, h, m.headdim),
            rand(1, seq, h),
            rand(1, seq, m.ngroups, m.d_state),
            rand(1, seq, m.ngroups, m.d_state),
            torch.log(torch.expm1(torch.linspace(1e-3, 1e-1, h, device=device))),
            torch.log(torch.linspace(1.0, 16.0, h, device=device)),
            torch.randn(h, device=device, generator=gen),
        )
    ]


def meshplan_scan(x, dt, B, C, dt_bias, a_log, D):
    """meshplan's Triton scan as Mamba2Block calls it: bias, softplus and A in fp32 torch first."""
    from meshplan.kernels.ssd_combined import ssd_chunked

    dt = F.softplus(acc(dt) + acc(dt_bias))
    y, _ = ssd_chunked(x, dt, -torch.exp(acc(a_log)), B, C, D, chunk=SSD_CHUNK)
    return y


def peer_scan(kernels, chunk: int):
    """mamba_ssm's scan as its Mamba2 calls it (dt_bias and softplus inside), at `chunk` tokens a chunk."""

    def scan(x, dt, B, C, dt_bias, a_log, D):
        A = -torch.exp(a_log.float())
        return kernels.chunk_scan(x, dt, A, B, C, chunk_size=chunk, D=D, dt_bias=dt_bias, dt_softplus=True)

    return scan


def forward_backward(fn, leaves: list[torch.Tensor], dy: torch.Tensor):
    """fn's output and its leaves' gradients from `dy` (torch.autograd.grad: nothing accumulates)."""
    y = fn(*leaves)
    return y, torch.autograd.grad(y, leaves, dy)


# ---- the block ---------------------------------------------------------------------------------------


class PeerMamba2Block(nn.Module):
    """meshplan's Mamba2Block as mamba_ssm's Mamba2 runs it without causal_conv1d (module docstring)."""

    def __init__(self, model: ModelSpec, kernels, chunk: int):
        super().__init__()
        m = model.mamba2
        self.m, self.eps, self.chunk = m, model.norm_eps, chunk
        self.kernels = kernels
        self.norm_weight = nn.Parameter(torch.ones(m.d_model))
        self.in_proj = nn.Linear(m.d_model, m.in_proj_width, bias=False)
        self.conv1d = nn.Conv1d(m.conv_dim, m.conv_dim, m.d_conv, groups=m.conv_dim, padding=m.d_conv - 1)
        self.dt_bias = nn.Parameter(torch.zeros(m.nheads))
        self.A_log = nn.Parameter(torch.zeros(m.nheads))
        self.D = nn.Parameter(torch.ones(m.nheads))
        self.gated_norm_weight = nn.Parameter(torch.ones(m.d_inner))
        self.out_proj = nn.Linear(m.d_inner, m.d_model, bias=False)

    def pairs(self, ref: Mamba2Block) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
        """(name, this block's parameter, meshplan's) for every weight (conv1d's holds (c, 1, k), meshplan's (c, k))."""
        return [
            ("norm", self.norm_weight, ref.norm.weight),
            ("in_proj", self.in_proj.weight, ref.in_proj),
            ("conv_w", self.conv1d.weight, ref.conv_w),
            ("conv_b", self.conv1d.bias, ref.conv_b),
            ("dt_bias", self.dt_bias, ref.dt_bias),
            ("A_log", self.A_log, ref.a_log),
            ("D", self.D, ref.d_skip),
            ("gated_norm", self.gated_norm_weight, ref.norm_w),
            ("out_proj", self.out_proj.weight, ref.out_proj),
        ]

    def load_from(self, ref: Mamba2Block) -> "PeerMamba2Block":
        with torch.no_grad():
            for _, mine, theirs in self.pairs(ref):
                mine.copy_(theirs.reshape(mine.shape))
        return self

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        m, (b, s, _) = self.m, u.shape
        zxbcdt = self.in_proj(self.kernels.rmsnorm(u, self.norm_weight, None, eps=self.eps))
        z, xbc, dt = zxbcdt.split([m.d_inner, m.conv_dim, m.nheads], dim=-1)
        xbc = F.silu(self.conv1d(xbc.transpose(1, 2)).transpose(1, 2)[:, : -(m.d_conv - 1)])
        x, B, C = xbc.split([m.d_inner, m.ngroups * m.d_state, m.ngroups * m.d_state], dim=-1)
        y = self.kernels.chunk_scan(
            x.reshape(b, s, m.nheads, m.headdim),
            dt,
            -torch.exp(self.A_log.float()),
            B.reshape(b, s, m.ngroups, m.d_state),
            C.reshape(b, s, m.ngroups, m.d_state),
            chunk_size=self.chunk,
            D=self.D,
            dt_bias=self.dt_bias,
            dt_softplus=True,
        )
        y = self.kernels.gated_rmsnorm(
            y.reshape(b, s, m.d_inner),
            self.gated_norm_weight,
            None,
            z=z,
            eps=1e-5,  # Mamba2's RMSNormGated, and meshplan's gated norm
            group_size=m.d_inner // m.ngroups,
            norm_before_gate=False,
        )
        return u + self.out_proj(y)


def reference_blocks(model: ModelSpec, device: str, dtype: torch.dtype) -> nn.ModuleList:
    """meshplan's blocks with the seeded weights run.measure builds (seed 1234)."""
    torch.manual_seed(1234)
    return nn.ModuleList(Mamba2Block(model) for _ in range(model.layers)).to(device=device, dtype=dtype)


def peer_blocks(model: ModelSpec, kernels, chunk: int, refs: nn.ModuleList) -> nn.ModuleList:
    """The peer stack holding `refs`' weights (in their dtype and device)."""
    ref = next(refs.parameters())
    layers = nn.ModuleList(PeerMamba2Block(model, kernels, chunk) for _ in refs).to(device=ref.device, dtype=ref.dtype)
    for layer, r in zip(layers, refs):
        layer.load_from(r)
    return layers


# ---- agreement ---------------------------------------------------------------------------------------


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """‖got − want‖ / ‖want‖ in float64."""
    want = want.double()
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()


def agreement(errors: dict[str, float]) -> dict:
    """The record's fields for a pair's errors: each tensor's, the largest, and whether they agree."""
    worst = max(errors.values())
    return {"rel_err": errors, "max_rel_err": worst, "agrees": worst <= AGREE_REL_ERR}


def scan_errors(m: Mamba2Spec, seq: int, kernels, chunk: int, device: str, dtype: torch.dtype) -> dict:
    """mamba_ssm's scan output and leaf gradients against meshplan's, on the same leaves and dy."""
    leaves = scan_inputs(m, seq, device, dtype)
    dy = torch.randn(leaves[0].shape, device=device, generator=torch.Generator(device).manual_seed(1)).to(dtype)
    y_mine, g_mine = forward_backward(meshplan_scan, leaves, dy)
    y_peer, g_peer = forward_backward(peer_scan(kernels, chunk), leaves, dy)
    errors = {"y": rel_err(y_peer, y_mine)}
    errors.update({f"d{name}": rel_err(p, w) for name, p, w in zip(SCAN_LEAVES, g_peer, g_mine)})
    return agreement(errors)


def block_errors(model: ModelSpec, seq: int, kernels, chunk: int, device: str, dtype: torch.dtype) -> dict:
    """The peer stack's output, input gradient and weight gradients against meshplan's blocks'."""
    refs = reference_blocks(model, device, dtype)
    peers = peer_blocks(model, kernels, chunk, refs)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(1, seq, model.d_model, device=device, generator=gen).to(dtype)
    dy = torch.randn(x.shape, device=device, generator=gen).to(dtype)
    outs = {}
    for name, stack in (("meshplan", refs), ("peer", peers)):
        h = leaf = x.detach().clone().requires_grad_()
        for layer in stack:
            h = layer(h)
        h.backward(dy)
        outs[name] = (h.detach(), leaf.grad)
    errors = {"y": rel_err(outs["peer"][0], outs["meshplan"][0]), "dx": rel_err(outs["peer"][1], outs["meshplan"][1])}
    for i, (peer, ref) in enumerate(zip(peers, refs)):
        for name, mine, theirs in peer.pairs(ref):
            errors[f"layer{i}.d{name}"] = rel_err(mine.grad.reshape(theirs.shape), theirs.grad)
    return agreement(errors)

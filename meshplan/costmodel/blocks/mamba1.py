"""Mamba-1 blocks (mamba_ssm's Mamba with mamba_inner_fn): in_proj to x and z, a depthwise conv, x_proj
to dt, B, C, dt_proj, the selective scan, out_proj."""

from __future__ import annotations

from meshplan.costmodel.activations import FP32, Saved
from meshplan.costmodel.blocks.base import BlockKind
from meshplan.costmodel.blocks.ssm import boundary, decode_state_io, mixer_inputs_saved
from meshplan.costmodel.device import linear_gemm_time_s
from meshplan.costmodel.options import MemoryOptions
from meshplan.models import ModelSpec

MAMBA1_SCAN_CHUNK = 2048  # mamba_ssm selective_scan keeps fp32 states every 2048 tokens (selective_scan_fwd)


def mamba1_saved(model: ModelSpec, opts: MemoryOptions) -> list[Saved]:
    """Mamba-1 as mamba_ssm's `mamba_inner_fn` with checkpoint_lvl=1 (conv output and delta recomputed)."""
    m = model.mamba1
    e = opts.nbytes("act_dtype")
    return mixer_inputs_saved(m.d_model, e) + [
        Saved("xz", e * 2 * m.d_inner, "heads"),
        # x_dbl = (dt, B, C) from all channels: all-reduced under TP, so full on every rank.
        Saved("x_dbl", e * m.x_proj_width, "hidden"),
        Saved("scan_out", e * m.d_inner, "heads"),
        Saved("scan_chunk_states", FP32 * m.d_inner * 2 * m.d_state / MAMBA1_SCAN_CHUNK, "heads"),
    ]


class Mamba1(BlockKind):
    name = "mamba1"
    recurrent = True

    def spec(self, model):
        return model.mamba1

    def params(self, model):
        return model.mamba1.param_count()

    def gemms(self, model, head_div):
        m = model.mamba1
        di = m.d_inner / head_div
        return [(2 * di, m.d_model), (m.x_proj_width, di), (di, m.dt_rank), (m.d_model, di)]

    def memory_bound_bytes_per_token(self, model, head_div, e):
        m = model.mamba1
        di = m.d_inner / head_div
        # selective scan reads u, delta, z and B, C; writes y; conv reads and writes x.
        return e * (5 * m.d_model + 2 * di + 4 * di + 2 * m.d_state) + 4 * di * m.d_state * 2 / 2048

    def saved(self, model, opts):
        return mamba1_saved(model, opts)

    def partial_recompute_s(self, model, recompute, sh, *, gemm, core, mem, kernel_fwd, tokens, e, dev):
        # The mixer core (conv, scan, gated norm, out_proj) is recomputed in backward.
        return mem + kernel_fwd + linear_gemm_time_s(tokens, *self.gemms(model, sh.head_div)[-1], e, dev)

    def decode(self, comp, model, batch, seq, sh, opts, dev):
        return decode_state_io(comp, self.spec(model), batch, sh, opts, dev)

    def boundary_bytes(self, model, batch, head_div, opts, shards=1):
        m = model.mamba1
        conv, state = m.d_inner / head_div, m.d_inner * m.d_state / head_div
        return boundary(m, conv, state, state, batch, opts, shards)


MAMBA1 = Mamba1()

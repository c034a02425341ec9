"""Dense MLP blocks: gated (SwiGLU: gate and up, then down) or not (fc1, activation, fc2)."""

from __future__ import annotations

from dataclasses import replace

from meshplan.costmodel.activations import MASK, NORM_STATS, Saved
from meshplan.costmodel.blocks.base import BlockKind
from meshplan.costmodel.options import MemoryOptions
from meshplan.models import ModelSpec


def mlp_saved(model: ModelSpec, opts: MemoryOptions) -> list[Saved]:
    mlp = model.mlp
    e = opts.nbytes("act_dtype")
    f = mlp.ffn_hidden
    gemm_in = opts.gemm_input_bytes  # fc1's and fc2's inputs, in FP8 under --precision fp8 (TE saves them so)
    items = [
        Saved("mlp_norm_input", e * mlp.hidden, "hidden"),
        Saved("mlp_norm_stats", NORM_STATS[model.norm], "hidden"),
        Saved("mlp_input", gemm_in * mlp.hidden, "hidden"),
    ]
    if mlp.gated:
        # SwiGLU: silu saves its input (gate), the product saves silu(gate) and up, down saves the product.
        items += [
            Saved("gate", e * f, "heads"),
            Saved("up", e * f, "heads"),
            Saved("gated_product", gemm_in * f, "heads"),
        ]
        if not opts.stack_spec.fused_swiglu:
            items.append(Saved("silu_gate", e * f, "heads"))
    else:
        items += [Saved("fc1_out", e * f, "heads"), Saved("act_out", gemm_in * f, "heads")]
    # Megatron's "mlp" recompute checkpoints the MLP from its input: with Transformer Engine's spec the
    # pre-norm is fused into fc1 (TELayerNormColumnParallelLinear), so all but the norm's input is rebuilt
    items = items[:1] + [replace(item, module=("mlp",)) for item in items[1:]]
    if opts.dropout:  # the bias-dropout-add is the layer's, outside the checkpoint
        items.append(Saved("mlp_dropout_mask", MASK * mlp.out_hidden, "hidden"))
    return items


class Mlp(BlockKind):
    name = "mlp"
    recompute_modules = ("mlp",)

    def params(self, model):
        return model.mlp.param_count()

    def norm_width(self, model):
        return model.mlp.hidden

    def streamed_params(self, model):
        """Less both norm scales (the output's too, Gemma's), whole on every TSP rank as the input's."""
        return self.params(model) - self.norm_width(model) - model.mlp.norm_extra

    def output_width(self, model):
        return model.mlp.out_hidden

    def gemms(self, model, head_div):
        f = model.mlp
        return [(f.n_input_matrices * f.ffn_hidden / head_div, f.hidden), (f.out_hidden, f.ffn_hidden / head_div)]

    def memory_bound_bytes_per_token(self, model, head_div, e):
        f = model.mlp
        return e * (5 * f.hidden + 3 * f.ffn_hidden / head_div)  # SwiGLU reads gate, up; writes product

    def saved(self, model, opts):
        return mlp_saved(model, opts)


MLP = Mlp()

"""Mixture-of-experts MLPs (Mixtral, Qwen-MoE, DeepSeek): three block kinds, so that each parallel axis
can split them apart — expert parallelism splits the routed experts over ranks and leaves the router
and the shared experts to the tensor axis.

- router: the MoE layer's pre-norm and the hidden → experts projection (top-k of a softmax);
- experts: the routed experts; a token runs `top_k` of them, so a layer's expert GEMMs are top_k times
  one expert's on every token, and the tokens are copied into expert order and back (the permutation);
- shared_expert: experts every token runs (a dense MLP `shared_ffn` wide, gated like the routed ones;
  Qwen2-MoE's sigmoid gate beside it).
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.costmodel.activations import FP32, NORM_STATS, Saved
from meshplan.costmodel.blocks.base import FP8_AMAX_BYTES, FP8_CAST_BYTES, BlockKind, selective_modules
from meshplan.costmodel.device import grouped_gemm_time_s
from meshplan.costmodel.options import MemoryOptions
from meshplan.models import ModelSpec

INDEX = 8  # an int64 index


class Router(BlockKind):
    name = "router"
    tensor_comms = False  # replicated on every tensor rank
    fp8_gemms = False  # a plain torch linear in Megatron-Core (TopKRouter), not Transformer Engine's
    # MoELayer.forward (router, dispatch, experts, combine) checkpointed whole; the block's pre-norm and
    # residual traffic, outside Megatron's checkpoint, are redone with it here (a few h-wide passes)
    recompute_modules = ("moe",)

    def params(self, model):
        return model.moe.router_params()

    def norm_width(self, model):
        return model.moe.hidden

    def gemms(self, model, head_div):
        return [(model.moe.experts, model.moe.hidden)]  # replicated on every tensor rank: tiny

    def memory_bound_bytes_per_token(self, model, head_div, e):
        # The pre-norm (read, write), the residual (two reads, a write), the router's fp32 softmax.
        return e * 5 * model.moe.hidden + FP32 * 2 * model.moe.experts

    def eager_factor(self, dev, model=None, head_div=1):
        return dev.elementwise_factor_routing

    def partial_recompute_s(self, model, recompute, sh, *, gemm, core, mem, kernel_fwd, tokens, e, dev):
        # "layernorm": the pre-norm's forward again (its read and write of the 5·h·e bytes counted above)
        if "layernorm" not in selective_modules(recompute):
            return 0.0
        return mem * 2 * e * model.moe.hidden / self.memory_bound_bytes_per_token(model, sh.head_div, e)

    def saved(self, model: ModelSpec, opts: MemoryOptions) -> list[Saved]:
        m, e = model.moe, opts.nbytes("act_dtype")
        # The pre-norm is Transformer Engine's TENorm apart from any linear (a grouped GEMM takes no fused
        # norm): "layernorm" recompute keeps its input and rebuilds its statistics and output; "moe"
        # recompute keeps the MoE layer's input (the norm output) and rebuilds the rest.
        return [
            Saved("moe_norm_input", e * m.hidden, "hidden"),
            Saved("moe_norm_stats", NORM_STATS[model.norm], "hidden", module=("layernorm",)),
            Saved("router_input", e * m.hidden, "hidden", module=("layernorm",)),
            Saved("router_probs", FP32 * m.experts, "hidden", module=("moe",)),
            # the fused permutation's row-id map, an int64 per token and expert (Megatron-MoE-ModelZoo
            # misc/tools/deepseek_mem_estimate.py: permute_row_id_map, s/TP · E · 8 B)
            Saved("routing_map", INDEX * m.experts, "hidden", module=("moe",)),
        ]


class _ExpertMlp(BlockKind):
    """An MLP of the MoE layer, behind the router's norm (it has none of its own)."""

    def norm_width(self, model):
        return 0

    def output_width(self, model):
        return model.moe.hidden


class Experts(_ExpertMlp):
    name = "experts"
    recompute_modules = ("moe",)
    tensor_comms = False  # the expert axes route the tokens and gather them (meshplan.costmodel.axes.ep)

    def params(self, model):
        return model.moe.experts * model.moe.expert_params()

    def gemms(self, model, head_div):
        # Every token runs top_k experts: top_k times one expert's projections (split by the tensor axis).
        m = model.moe
        width = m.top_k * m.expert_ffn / head_div
        return [(m.n_input_matrices * width, m.hidden), (m.hidden, width)]

    def load(self, opts):
        return opts.expert_load

    def fp8_weight_params(self, model):
        # every expert's matrices (`gemms` counts top_k experts' shapes: what a token runs)
        m = model.moe
        return m.experts * (m.n_input_matrices + 1) * m.expert_ffn * m.hidden

    def gemm_s(self, model, tokens, sh, e, dev):
        """A grouped GEMM over the experts a rank holds (E / ep), each running the routed copies that
        reach it: tokens · top_k of them spread evenly (`tokens` already the busiest rank's)."""
        m = model.moe
        local = m.experts * sh.head_div / sh.weight_div
        rows = tokens * m.top_k / local
        width = m.expert_ffn / sh.head_div
        shapes = [(m.n_input_matrices * width, m.hidden), (m.hidden, width)]
        return sum(grouped_gemm_time_s(rows, n, k, local, e, dev) for n, k in shapes)

    def memory_bound_bytes_per_token(self, model, head_div, e):
        # The permutation into expert order and back (top_k copies read and written each way), the
        # weighted sum of the copies, and SwiGLU over every copy's intermediate.
        return e * (self._routing_elements(model) + self._activation_elements(model, head_div))

    @staticmethod
    def _routing_elements(model) -> float:
        m = model.moe
        return 4 * m.top_k * m.hidden + (m.top_k + 1) * m.hidden

    @staticmethod
    def _activation_elements(model, head_div) -> float:
        m = model.moe
        return 3 * m.top_k * m.expert_ffn / head_div

    def eager_factor(self, dev, model, head_div=1):
        """The routing's share of the bytes at the routing factor, the activation's at the elementwise one
        (Device.elementwise_factor_routing, elementwise_factor: the same 1 under a fused stack)."""
        routing, act = self._routing_elements(model), self._activation_elements(model, head_div)
        return (routing * dev.elementwise_factor_routing + act * dev.elementwise_factor) / (routing + act)

    def fp8_cast_bytes_per_token(self, model, head_div, current_scaling):
        """TEGroupedLinear quantizes the routed copies (top_k of them a token) and the activation's output
        before fc2, forward; both projections' output gradients in backward (multi_cast_transpose under
        delayed scaling, a cast with its amax pass an expert under current)."""
        m = model.moe
        cast = FP8_CAST_BYTES + (FP8_AMAX_BYTES if current_scaling else 0.0)
        width = m.top_k * m.expert_ffn / head_div
        return (m.top_k * m.hidden + width) * cast, (m.n_input_matrices * width + m.top_k * m.hidden) * cast

    def partial_recompute_s(self, model, recompute, sh, *, gemm, core, mem, kernel_fwd, tokens, e, dev):
        # "moe_act": the experts' activation (SwiGLU over every copy's intermediate, counted above) again
        if "moe_act" not in selective_modules(recompute):
            return 0.0
        m = model.moe
        act = 3 * m.top_k * m.expert_ffn / sh.head_div * e
        return mem * act / self.memory_bound_bytes_per_token(model, sh.head_div, e)

    def saved(self, model: ModelSpec, opts: MemoryOptions) -> list[Saved]:
        m, e = model.moe, opts.nbytes("act_dtype")
        f = m.top_k * m.expert_ffn
        # Megatron-Core's TEGroupedMLP: fc1 saves the permuted copies, the activation its input (and
        # the routing probabilities it multiplies in), fc2 the activation's output; the unpermutation
        # keeps nothing (the probabilities are applied in the activation, core 0.13).
        # fc1's and fc2's inputs in FP8 under --precision fp8 (TEGroupedLinear saves them quantized)
        gemm_in = opts.gemm_input_bytes
        items = [
            Saved("expert_inputs", gemm_in * m.top_k * m.hidden, "hidden"),  # the permuted copies
            Saved("expert_probs", FP32 * m.top_k, "hidden"),
        ]
        # "moe_act" recompute (Megatron's, grouped GEMM only) keeps fc1's output and rebuilds the activation's
        act = ("moe", "moe_act")
        if m.gated:
            items += [Saved("expert_gate", e * f, "heads"), Saved("expert_up", e * f, "heads")]
            items += [Saved("expert_product", gemm_in * f, "heads", module=act)]
        else:
            items += [Saved("expert_fc1_out", e * f, "heads")]
            items += [Saved("expert_act_out", gemm_in * f, "heads", module=act)]
        return [item if item.module else replace(item, module=("moe",)) for item in items]


class SharedExpert(_ExpertMlp):
    """Split by the tensor axis as a dense MLP is: its sequence shards gathered, its output
    reduce-scattered (Megatron-Core's SharedExpertMLP)."""

    name = "shared_expert"
    norm_fed = False  # its input is the router's norm output (TENorm apart): its own Linear casts it
    # inside MoELayer (its "moe" checkpoint), or checkpointed alone ("shared_experts")
    recompute_modules = ("moe", "shared_experts")

    def params(self, model):
        return model.moe.shared_params()

    def gemms(self, model, head_div):
        m = model.moe
        out = [(m.n_input_matrices * m.shared_ffn / head_div, m.hidden), (m.hidden, m.shared_ffn / head_div)]
        return out + ([(1, m.hidden)] if m.shared_gate else [])

    def memory_bound_bytes_per_token(self, model, head_div, e):
        m = model.moe
        return e * (3 * m.hidden + 3 * m.shared_ffn / head_div)  # SwiGLU, and adding to the routed output

    def saved(self, model: ModelSpec, opts: MemoryOptions) -> list[Saved]:
        m, e = model.moe, opts.nbytes("act_dtype")
        # Its input is the router's (saved there, in bf16); under FP8 its fc1 keeps its own FP8 copy, and
        # its fc2 input is saved in FP8 (TE's Linear).
        gemm_in = opts.gemm_input_bytes
        fp8_input = [Saved("shared_input_fp8", gemm_in * m.hidden, "hidden")] if opts.precision != "bf16" else []
        if not m.gated:  # Nemotron-H's squared-ReLU shared expert: up, and its activation for down
            items = fp8_input + [
                Saved("shared_fc1_out", e * m.shared_ffn, "heads"),
                Saved("shared_act_out", gemm_in * m.shared_ffn, "heads"),
            ]
        else:
            items = fp8_input + [
                Saved("shared_gate", e * m.shared_ffn, "heads"),
                Saved("shared_up", e * m.shared_ffn, "heads"),
                Saved("shared_product", gemm_in * m.shared_ffn, "heads"),
            ]
        return [replace(item, module=self.recompute_modules) for item in items]


ROUTER, EXPERTS, SHARED_EXPERT = Router(), Experts(), SharedExpert()


def tensor_replicated_params(model: ModelSpec, head_div: int) -> float:
    """Extra parameters per rank when a tensor axis splits an MoE model's layers `head_div` ways: each
    MoE layer's router projection (and bias), and Qwen2-MoE's shared-expert gate, stay whole on every
    tensor rank (Megatron-Core's TopKRouter.weight and SharedExpertMLP.gate_weight are not split; nor
    are meshplan's executor's, executor/layouts/ep.py). The norm scales are counted with the others."""
    m = model.moe
    if m is None or head_div == 1:
        return 0.0
    layers = dict(model.block_invocations()).get("router", 0)
    whole = m.router_params() - m.hidden + (m.hidden if m.shared_gate and m.shared_ffn else 0)
    return layers * whole * (1 - 1 / head_div)

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

from meshplan.costmodel.activations import FP32, NORM_STATS, Saved
from meshplan.costmodel.blocks.base import BlockKind
from meshplan.costmodel.options import MemoryOptions
from meshplan.models import ModelSpec

INDEX = 8  # an int64 index a routed copy of a token (its expert and its position), as torch keeps them


class Router(BlockKind):
    name = "router"
    tensor_comms = False  # replicated on every tensor rank

    def params(self, model):
        return model.moe.router_params()

    def norm_width(self, model):
        return model.moe.hidden

    def gemms(self, model, head_div):
        return [(model.moe.experts, model.moe.hidden)]  # replicated on every tensor rank: tiny

    def memory_bound_bytes_per_token(self, model, head_div, e):
        # The pre-norm (read, write), the residual (two reads, a write), the router's fp32 softmax.
        return e * 5 * model.moe.hidden + FP32 * 2 * model.moe.experts

    def saved(self, model: ModelSpec, opts: MemoryOptions) -> list[Saved]:
        m, e = model.moe, opts.nbytes("act_dtype")
        return [
            Saved("moe_norm_input", e * m.hidden, "hidden"),
            Saved("moe_norm_stats", NORM_STATS[model.norm], "hidden"),
            Saved("router_input", e * m.hidden, "hidden"),
            Saved("router_probs", FP32 * m.experts, "hidden"),
        ]


class _ExpertMlp(BlockKind):
    """An MLP of the MoE layer, behind the router's norm (it has none of its own)."""

    def norm_width(self, model):
        return 0

    def output_width(self, model):
        return model.moe.hidden


class Experts(_ExpertMlp):
    name = "experts"

    def params(self, model):
        return model.moe.experts * model.moe.expert_params()

    def gemms(self, model, head_div):
        # Every token runs top_k experts: top_k times one expert's projections (split by the tensor axis).
        m = model.moe
        width = m.top_k * m.expert_ffn / head_div
        return [(m.n_input_matrices * width, m.hidden), (m.hidden, width)]

    def memory_bound_bytes_per_token(self, model, head_div, e):
        # The permutation into expert order and back (top_k copies read and written each way), the
        # weighted sum of the copies, and SwiGLU over every copy's intermediate.
        m = model.moe
        return e * (4 * m.top_k * m.hidden + (m.top_k + 1) * m.hidden + 3 * m.top_k * m.expert_ffn / head_div)

    def saved(self, model: ModelSpec, opts: MemoryOptions) -> list[Saved]:
        m, e = model.moe, opts.nbytes("act_dtype")
        f = m.top_k * m.expert_ffn
        items = [
            Saved("expert_inputs", e * m.top_k * m.hidden, "hidden"),  # the permuted copies
            Saved("routing_indices", INDEX * m.top_k, "hidden"),
        ]
        if m.gated:
            items += [Saved("expert_gate", e * f, "heads"), Saved("expert_up", e * f, "heads")]
            items += [Saved("expert_product", e * f, "heads")]
        else:
            items += [Saved("expert_fc1_out", e * f, "heads"), Saved("expert_act_out", e * f, "heads")]
        items.append(Saved("expert_outputs", e * m.top_k * m.hidden, "hidden"))  # for the weights' gradient
        return items


class SharedExpert(_ExpertMlp):
    name = "shared_expert"
    tensor_comms = False  # its output joins the routed experts' before their one reduction

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
        if not m.gated:  # Nemotron-H's squared-ReLU shared expert: up, and its activation for down
            return [
                Saved("shared_fc1_out", e * m.shared_ffn, "heads"),
                Saved("shared_act_out", e * m.shared_ffn, "heads"),
            ]
        return [
            Saved("shared_gate", e * m.shared_ffn, "heads"),
            Saved("shared_up", e * m.shared_ffn, "heads"),
            Saved("shared_product", e * m.shared_ffn, "heads"),
        ]


ROUTER, EXPERTS, SHARED_EXPERT = Router(), Experts(), SharedExpert()

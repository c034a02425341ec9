"""The tensors each block saves for backward, one named entry each.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", §4.1)
count per layer, with bf16 activations, 1-byte dropout masks, LayerNorm, GeLU MLP with F = 4 and no
fused attention: attention 11·sbh + 5·a·s²·b, MLP 19·sbh, two norms 4·sbh, i.e.
s·b·h·(34 + 5·a·s/h). Listing the tensors one by one reproduces that sum (tests/test_activations.py)
and extends it to what Korthikanti does not cover: gated MLPs, GQA, fused attention (which keeps the
output and a per-head log-sum-exp instead of the s² scores), norm statistics, and Mamba blocks.

Each entry's `split` says how a layout divides it (all entries are per token, so every entry is
also divided by the layout's token split):
- "hidden": full-width tensors that TP replicates (norm inputs, projection inputs, dropout masks);
  Megatron-SP splits them by T as well.
- "heads": tensors between a column-parallel and a row-parallel projection: divided by T.
- "groups": Mamba-2's B and C, split by T when T divides ngroups, else replicated to the ranks whose
  heads share a group: divided by gcd(T, ngroups).
Entries with `quadratic=True` scale with the key length too (the s² attention scores).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from meshplan.costmodel.options import MemoryOptions
from meshplan.models import ModelSpec

FP32 = 4  # norm statistics and the attention log-sum-exp are kept in fp32
MASK = 1  # a dropout mask is one byte per element (Korthikanti §4.1)
NORM_STATS = {"rmsnorm": FP32, "layernorm": 2 * FP32}  # rstd; LayerNorm also keeps the mean


@dataclass(frozen=True)
class Saved:
    name: str
    bytes_per_token: float  # at full (unsharded) width
    split: str  # "hidden" | "heads"
    quadratic: bool = False  # × key length (attention scores)
    recomputed_by_selective: bool = False  # Korthikanti's selective recompute drops it
    # The Megatron recompute modules whose checkpoint drops it (options.RECOMPUTE_MODULES; (): none does)
    module: tuple[str, ...] = ()

    def dropped(self, opts) -> bool:
        """Selective recompute rebuilds it in backward instead of keeping it."""
        if self.recomputed_by_selective:
            return opts.recomputes("core_attn")
        return any(opts.recomputes(m) for m in self.module)


def head_saved(model: ModelSpec, opts: MemoryOptions) -> list[Saved]:
    """Final norm and the LM head input (once per model, not per layer)."""
    e = opts.nbytes("act_dtype")
    # The loss keeps, a token, the fp32 sum of exponentials, the target's int64 column and whether this
    # rank's vocabulary holds it; the embedding its int64 ids (meshplan/executor/layouts/vocab.py). The
    # fp32 logits it keeps are the logits phase's (memory.memory_per_gpu).
    return [
        Saved("final_norm_input", e * model.d_model, "hidden"),
        Saved("final_norm_stats", FP32, "hidden"),
        Saved("lm_head_input", e * model.d_model, "hidden"),
        Saved("loss_stats", FP32 + 8 + 1, "hidden"),
        Saved("embedding_ids", 8, "hidden"),
    ]


def checkpoint_units(model: ModelSpec) -> list[tuple[tuple[str, ...], int, int]]:
    """(blocks in the unit, how many times the unit runs, width of the unit's input).

    Full recompute keeps only each unit's input; a dense layer is attention + MLP, a Mamba layer is
    one block, a hybrid invocation of the shared block is attention + MLP + its projection; a mixture
    of experts' or a mixed model's layer is its own unit, alike layers counted together.
    """
    if model.family == "dense":
        return [(("attention", "mlp"), model.layers, model.d_model)]
    if model.family in ("mamba2", "mamba1"):
        return [((model.family,), model.layers, model.d_model)]
    if model.family in ("moe", "mixed"):  # each kind of layer one unit
        counts = Counter(model.layer_blocks())
        return [(blocks, n, model.d_model) for blocks, n in counts.items()]
    return [
        (("mamba2",), model.layers, model.d_model),
        (("attention", "mlp", "hybrid_proj"), model.hybrid_invocations, model.attention.hidden),
    ]

"""What every block kind supplies to the cost model (docs/design.md §8, "add a block kind"): its
parameters, its projections, its memory-bound bytes, the tensors it saves, and — where the kind has
them — its own kernels, transients, decode traffic, recompute and collectives. The defaults are a
block with nothing of its own beyond GEMMs and elementwise work; each kind's module overrides what it
has. BlockCompute is one invocation's time on one rank."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.costmodel.device import gemm_time_s, linear_gemm_time_s

# FlashAttention-2 (Dao 2023): the attention core's backward runs 5 matmuls to forward's 2.
ATTENTION_BWD_FACTOR = 2.5


# Transformer Engine 2.x's FP8 quantize traffic an element on Hopper, whose FP8 GEMMs take only the TN layout
# (csrc quantizer.cpp: with_transpose when the columnwise copy is used; cast_kernels.cuh cast_transpose;
# normalization.cpp / ln_api.cpp: the norm writes FP8 under delayed scaling, a separate nvte_transpose
# follows; quantizer.cpp quantize_impl: current scaling runs nvte_compute_amax over the tensor first):
FP8_CAST_BYTES = 2 + 1 + 1  # read bf16, write the FP8 copy and its transpose
FP8_AMAX_BYTES = 2  # current scaling's amax pass: the bf16 tensor read once more
FP8_NORM_FUSED_BYTES = -1 + 1 + 1  # the norm writes 1 B instead of 2; the transpose reads 1 and writes 1


def selective_modules(recompute: str) -> frozenset[str]:
    """The Megatron recompute modules a block's `recompute` (step.kind_recompute's "selective:<modules>")
    lists; none under "none" or "full" (full redoes the whole block)."""
    head, _, modules = recompute.partition(":")
    return frozenset(modules.split(",")) if head == "selective" and modules else frozenset()


@dataclass(frozen=True)
class BlockCompute:
    gemm_fwd_s: float  # projections (what TSP's weight stream can hide behind)
    attn_fwd_s: float  # the attention core
    mem_fwd_s: float  # memory-bound work
    recompute_fwd_s: float  # extra forward work redone in backward
    flops_fwd: float  # model FLOPs (no recompute)
    kernel_fwd_s: float = 0.0  # Mamba-2's scan and conv kernels
    kernel_bwd_s: float = 0.0
    attn_bwd_factor: float = ATTENTION_BWD_FACTOR  # backward / forward time of the attention core
    # FP8 quantize kernels around the FP8 GEMMs (BlockKind.fp8_cast_bytes_per_token), forward and backward
    cast_fwd_s: float = 0.0
    cast_bwd_s: float = 0.0
    # Data motion around a sequence shard's attention kernels (BlockKind.shard_motion_s), forward and backward
    motion_fwd_s: float = 0.0
    motion_bwd_s: float = 0.0

    @property
    def fwd_s(self) -> float:
        return (
            self.gemm_fwd_s + self.attn_fwd_s + self.mem_fwd_s + self.kernel_fwd_s + self.cast_fwd_s + self.motion_fwd_s
        )

    @property
    def bwd_s(self) -> float:
        return (
            2 * self.gemm_fwd_s
            + self.attn_bwd_factor * self.attn_fwd_s
            + 2 * self.mem_fwd_s
            + self.recompute_fwd_s
            + self.kernel_bwd_s
            + self.cast_bwd_s
            + self.motion_bwd_s
        )


class BlockKind:
    """One kind of block; subclasses override what their kind has."""

    name = ""
    attends = False  # attends over the sequence: K/V gathered on sequence shards, a KV cache
    recurrent = False  # carries state along the sequence: conv tails and SSM states at shard edges
    triton_launches = False  # launches mostly Triton kernels, whose host cost calibrate measures apart
    # Megatron TP reduces the block's row-parallel output over the tensor axis (False: the block is
    # replicated there, or its output is summed with another's before one reduction)
    tensor_comms = True
    # Its projections are Transformer Engine Linear modules, run in FP8 under --precision fp8
    # (meshplan.costmodel.stacks.FP8_GEMM_LAYERS); False: they stay bf16 (the router's)
    fp8_gemms = True
    # Its first projection reads its pre-norm's output, which Transformer Engine's LayerNormLinear
    # quantizes itself (fp8_cast_bytes_per_token)
    norm_fed = True
    # Megatron recompute modules that checkpoint the whole block (options.RECOMPUTE_MODULES): under
    # selective recompute listing one, the block is redone in backward and keeps only its input
    recompute_modules: tuple[str, ...] = ()

    # -- shapes --------------------------------------------------------------------------------
    def params(self, model) -> int:
        raise NotImplementedError

    def norm_width(self, model) -> int:
        """Elements of the block's input norm scale (every rank keeps a copy under TSP)."""
        return model.d_model

    def streamed_params(self, model) -> int:
        """What TSP streams of the block: its weights less the input norm's scale."""
        return self.params(model) - self.norm_width(model)

    def output_width(self, model) -> int:
        return model.d_model

    def gemms(self, model, head_div: int) -> list[tuple[float, float]]:
        """(n, k) of each projection on one rank (m is the token count)."""
        raise NotImplementedError

    def fp8_weight_params(self, model) -> float:
        """Weights of one block that FP8 GEMMs read (Transformer Engine keeps an FP8 copy of each): its
        projections' matrices, whole (`gemms` at no split); 0 for a block whose GEMMs stay bf16."""
        return sum(n * k for n, k in self.gemms(model, 1)) if self.fp8_gemms else 0.0

    def memory_bound_bytes_per_token(self, model, head_div: int, e: int) -> float:
        """HBM traffic of the non-GEMM work a token: norm, residual, the block's elementwise ops."""
        raise NotImplementedError

    def fp8_cast_bytes_per_token(self, model, head_div: int, current_scaling: bool) -> tuple[float, float]:
        """(forward, backward) HBM bytes a token of Transformer Engine's quantize kernels around the block's
        FP8 GEMMs, on Hopper (TE 2.x; docs/design.md §4a): each GEMM input cast with its transposed copy
        (read 2 B, write 1 + 1); the first's, where `norm_fed`, by the pre-norm itself (delayed scaling:
        the norm writes 1 B instead of its 2, a transpose reads and writes 1 + 1; current scaling: the
        norm's bf16 output cast and transposed, its amax fused in the norm); each output gradient cast
        and transposed in backward; under current scaling every other cast reads its tensor once more for
        the amax (2 B). Weights are cast once a step (the first micro-batch), not counted."""
        if not self.fp8_gemms:
            return 0.0, 0.0
        cast = FP8_CAST_BYTES + (FP8_AMAX_BYTES if current_scaling else 0.0)
        fwd = bwd = 0.0
        for i, (n, k) in enumerate(self.gemms(model, head_div)):
            if i == 0 and self.norm_fed:
                fwd += k * (FP8_CAST_BYTES if current_scaling else FP8_NORM_FUSED_BYTES)
            else:
                fwd += k * cast
            bwd += n * cast
        return fwd, bwd

    def saved(self, model, opts) -> list:
        """The tensors one invocation saves for backward (meshplan.costmodel.activations.Saved)."""
        raise NotImplementedError

    def load(self, opts) -> float:
        """The busiest rank's share of the block's work over the even share (routed experts under
        uneven routing or a capacity); 1 for a block every token runs."""
        return 1.0

    # -- compute -------------------------------------------------------------------------------
    def eager_factor(self, dev, model=None, head_div: float = 1) -> float:
        """HBM passes of the block's memory-bound work per pass counted (Device.elementwise_factor)."""
        return dev.elementwise_factor

    def gemm_s(self, model, tokens: float, sh, e: int, dev) -> float:
        """Seconds of the block's projections over `tokens` tokens on one rank (`gemms`, each by
        roofline at the stack's GEMM rate, in FP8 where the run and the block take it)."""
        timer = linear_gemm_time_s if self.fp8_gemms else gemm_time_s
        return sum(timer(tokens, n, k, e, dev) for n, k in self.gemms(model, sh.head_div))

    def core_s(self, model, tokens, keys, sh, e, dev, *, causal_fraction, zigzag) -> tuple[float, float]:
        """(seconds, FLOPs) of a core beyond the projections (attention's); none by default."""
        return 0.0, 0.0

    def core_bwd_factor(self, dev) -> float:
        """The core's backward time over its forward's."""
        return ATTENTION_BWD_FACTOR

    def shard_motion_s(self, model, tokens, sh, e, dev, *, zigzag) -> tuple[float, float]:
        """(forward, backward) seconds of data motion around the block's kernels on sequence shards (none
        but attention's)."""
        return 0.0, 0.0

    def kernels_s(self, model, tokens, sh, e, dev, row_tokens) -> tuple[float, float]:
        """(forward, backward) seconds of the block's own kernels (Mamba-2's scan and conv)."""
        return 0.0, 0.0

    def partial_recompute_s(self, model, recompute, sh, *, gemm, core, mem, kernel_fwd, tokens, e, dev) -> float:
        """Forward work redone in backward short of full recompute (selective, or what the block's
        own autograd recomputes)."""
        return 0.0

    def selective_recompute_flops(self, model, tokens: float, seq: int) -> float:
        return 0.0

    def decode(self, comp: BlockCompute, model, batch, seq, sh, opts, dev) -> BlockCompute:
        """A decode step's time, given the projections' (`comp`): what the block reads per token."""
        return comp

    # -- memory --------------------------------------------------------------------------------
    def boundary_bytes(self, model, batch, head_div, opts, shards=1) -> float:
        """State a sequence shard keeps at its edges (conv tail, SSM state, gathered summaries)."""
        return 0.0

    def forward_transient_bytes(self, model, tokens, sh, e, *, decode=False, rows=1) -> float:
        """Transients of the block's own kernels in a forward without grad, beyond what it saves."""
        return 0.0

    def backward_transient_bytes(self, model, tokens, sh, e, rows=1) -> float | None:
        """The peak inside the block's own backward, where it lists its phases; None: the widest
        gradient of what it saved."""
        return None

"""The types every axis module fills: `Sharding` (how a layout divides a block's weights, tokens and
activations) and `PlanContext` (one plan with its sharding, shared by the memory, step and schedule
models)."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.shapes import local_bc_channels
from meshplan.layout import Layout
from meshplan.models import ModelSpec, frozen_hash


@dataclass(frozen=True)
class Sharding:
    weight_div: int  # each layer's weights (and grads, optimizer state) split this many ways
    token_div: int  # tokens per GPU = b·s / token_div
    head_div: int  # activations between a column- and a row-parallel projection (heads, F·h, d_inner)
    hidden_div: int  # extra split of full-width activations (Megatron-SP's T); tokens already / token_div
    vocab_div: int  # vocab-parallel logits (TP)
    gathers_kv: bool = False  # the whole sequence's K/V is gathered per attention layer
    streams_weights: bool = False  # TSP: other ranks' weight shards pass through each rank

    __hash__ = frozen_hash  # block_compute's cache keys on it


@dataclass(frozen=True)
class PlanContext:
    """One plan, its sharding computed once (meshplan.costmodel.axes.sharding_for): what memory_per_gpu,
    estimate_step and step_schedule share, and what an axis module needs to write a block's
    collectives (sizes in bytes). `batch` and `seq` are one micro-batch's."""

    model: ModelSpec
    layout: Layout
    sharding: Sharding
    batch: int
    seq: int
    opts: CostOptions
    # Block kinds an axis splits apart from the rest (expert parallelism splits experts alone): their
    # own sharding. Empty while every kind shares `sharding`.
    by_kind: dict = field(default_factory=dict, compare=False)

    def sharding_of(self, kind: str) -> Sharding:
        return self.by_kind.get(kind, self.sharding)

    @property
    def tokens(self) -> float:
        """Tokens on one rank of the model-parallel group (per micro-batch)."""
        return self.batch * self.seq / self.sharding.token_div

    @property
    def act_bytes(self) -> int:
        return self.opts.nbytes("act_dtype")

    @property
    def param_bytes(self) -> int:
        return self.model.param_bytes_per_element

    @property
    def grad_bytes(self) -> int:
        return self.opts.nbytes("grad_dtype")

    def widths(self, kind: str) -> tuple[int, int]:
        """(input width, output width) of a block, in elements."""
        m = self.model
        if kind == "attention":
            return m.attention.hidden, m.attention.out_hidden
        if kind == "mlp":
            return m.mlp.hidden, m.mlp.out_hidden
        return m.d_model, m.d_model

    def mamba_shard_summary_bytes(self, head_div: int) -> tuple[float, float]:
        """Per rank and micro-batch: (a sequence shard's summary — its zero-start final SSM state and
        log decay, fp32 — , the conv tail of d_conv − 1 tokens). Mamba-2 decays per head; Mamba-1 per
        state element."""
        m = self.model.mamba2 or self.model.mamba1
        if self.model.mamba2 is not None:
            ssm = m.nheads * m.headdim * m.d_state
            decay = m.nheads
            conv = m.d_inner / head_div + local_bc_channels(m, head_div)
        else:
            ssm, conv = m.d_inner * m.d_state, m.d_inner / head_div
            decay = ssm
        summary = (ssm * self.opts.nbytes("ssm_state_dtype") + decay * 4) / head_div
        return self.batch * summary, self.batch * conv * (m.d_conv - 1) * self.act_bytes

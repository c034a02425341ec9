"""The layout grammar: `dp=2,pp=2,tp=4`, `sp=8`, `tp=2,sp=4`, `tsp=8`, `tpssm=4,zero=1`.

A Layout is the degrees of each mesh axis; `validate_layout` checks it against a model (and a
cluster), `validate_seq` against a sequence length. Errors are one line naming the constraint.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields

from meshplan.errors import MeshplanError
from meshplan.models import ModelSpec, frozen_hash

# ep and etp fold onto the same ranks (Megatron-Core's MoE parallel folding, Liu et al. 2025, arXiv
# 2504.14960): the experts' decomposition etp × ep × edp of each stage's tp × sp × dp ranks; they add
# no ranks of their own.
AXES = ("dp", "pp", "tp", "sp", "tsp", "tpssm", "ep")
KEYS = AXES + ("etp", "zero")


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    pp: int = 1
    tp: int = 1
    sp: int = 1
    tsp: int = 1
    tpssm: int = 1
    ep: int = 1  # expert parallelism: each rank holds 1/ep of the routed experts
    etp: int = 0  # expert tensor parallelism: each routed expert's FFN split etp ways; 0: as tp (Megatron's default)
    zero: int = 0  # ZeRO stage over the dp axis: 1 optimizer state, 2 + gradients, 3 + parameters

    __hash__ = frozen_hash

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise MeshplanError(f"layout.{f.name} must be an integer, got {value!r}")
        for axis in AXES:
            if getattr(self, axis) < 1:
                raise MeshplanError(f"layout.{axis} must be >= 1, got {getattr(self, axis)}")
        if self.etp < 0:
            raise MeshplanError(f"layout.etp must be >= 1 (or left out: as tp), got {self.etp}")
        if not 0 <= self.zero <= 3:
            raise MeshplanError(f"layout.zero must be 0, 1, 2 or 3, got {self.zero}")
        if self.tsp > 1 and (self.tp > 1 or self.sp > 1 or self.tpssm > 1):
            raise MeshplanError(
                "layout: tsp folds tensor and sequence onto one axis; do not combine it with tp, sp or tpssm"
            )
        if self.tp > 1 and self.tpssm > 1:
            raise MeshplanError(
                "layout: tp and tpssm are the same weight axis; give one of them (tpssm for Mamba models)"
            )

    # -- the model-parallel axes -----------------------------------------------------------------
    @property
    def kind(self) -> str:
        """The model-parallel scheme: tp, sp, tp+sp, tsp, tpssm, tpssm+sp, or none."""
        t = self.tp > 1 or self.tpssm > 1
        name = "tpssm" if self.tpssm > 1 else "tp"
        if self.tsp > 1:
            return "tsp"
        if t and self.sp > 1:
            return f"{name}+sp"
        if t:
            return name
        return "sp" if self.sp > 1 else "none"

    @property
    def weight_axis(self) -> str:
        """The axis that splits each layer's weights: tsp, tpssm, or tp (also when nothing is split)."""
        return "tsp" if self.tsp > 1 else "tpssm" if self.tpssm > 1 else "tp"

    @property
    def sequence_axis(self) -> str | None:
        """The axis that splits the sequence: sp or tsp; None when every rank sees every token."""
        return "tsp" if self.tsp > 1 else "sp" if self.sp > 1 else None

    @property
    def tensor_degree(self) -> int:
        """T: the head / channel split of the TP axis (tp or tpssm); 1 for SP and TSP."""
        return self.tp * self.tpssm

    @property
    def weight_shard_degree(self) -> int:
        """How many ways each layer's weights are split: T, D, or 1 for SP."""
        return self.tensor_degree * self.tsp

    @property
    def token_shard_degree(self) -> int:
        """How many ways the sequence is split: Σ, D, or 1 for TP."""
        return self.sp * self.tsp

    @property
    def model_parallel_degree(self) -> int:
        return self.weight_shard_degree * self.sp

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.model_parallel_degree

    # -- the experts' decomposition of the same ranks (MoE parallel folding) -----------------------
    @property
    def expert_tensor_degree(self) -> int:
        """ETP: the split of each routed expert's FFN; the tensor degree unless `etp` says otherwise."""
        return self.etp or self.tensor_degree

    @property
    def stage_ranks(self) -> int:
        """Ranks of one pipeline stage: attention's tp × sp × dp, the experts' etp × ep × edp."""
        return self.dp * self.model_parallel_degree

    @property
    def expert_data_degree(self) -> int:
        """EDP: ranks holding the same expert shard, over which the experts' gradients are summed."""
        return max(1, self.stage_ranks // (self.expert_tensor_degree * self.ep))

    @property
    def folds_experts(self) -> bool:
        """The experts are laid out apart from attention: split over ep, or split otherwise than tp."""
        return self.ep > 1 or self.expert_tensor_degree != self.tensor_degree

    @property
    def expert_axes(self) -> bool:
        """The routed experts are laid out by their own axes etp × ep × edp (folded, or split over an
        expert-tensor axis), their gradients summed over edp; otherwise they are weights like any other."""
        return self.folds_experts or self.expert_tensor_degree > 1

    def __str__(self) -> str:
        parts = [f"{k}={getattr(self, k)}" for k in AXES if getattr(self, k) > 1]
        if self.etp and self.etp != self.tensor_degree:
            parts.append(f"etp={self.etp}")
        if self.zero:
            parts.append(f"zero={self.zero}")
        return ",".join(parts) or "single"


def grad_group(layout: Layout) -> tuple[str, int]:
    """Ranks holding the same weight shard: DP, and the Σ axis when SP replicates weights — the group
    over which gradients are summed and ZeRO shards (the cost model's schedule and memory, and the
    executor's meshplan.executor.parallelize.GradientSync)."""
    if layout.sp > 1:
        return ("dp+sp" if layout.dp > 1 else "sp"), layout.dp * layout.sp
    return "dp", layout.dp


def parse_layout(text: str) -> Layout:
    text = text.strip()
    if text in ("", "single", "none"):
        return Layout()
    values: dict[str, int] = {}
    for part in text.split(","):
        key, sep, raw = part.strip().partition("=")
        key = key.strip().lower()
        if not sep:
            raise MeshplanError(f"--layout: {part.strip()!r} is not key=value; write e.g. tp=4,dp=2")
        if key not in KEYS:
            hint = difflib.get_close_matches(key, KEYS, n=1, cutoff=0.5)
            fix = f"did you mean {hint[0]!r}?" if hint else f"use {', '.join(KEYS)}"
            raise MeshplanError(f"--layout: unknown axis {key!r}; {fix}")
        if key in values:
            raise MeshplanError(f"--layout: axis {key!r} given twice")
        try:
            values[key] = int(raw.strip())
        except ValueError:
            raise MeshplanError(f"--layout: {key}={raw.strip()!r} is not an integer") from None
    return Layout(**values)


def _divides(degree: int, count: int, what: str, axis: str) -> None:
    if count % degree:
        raise MeshplanError(
            f"layout: {axis}={degree} does not divide {what} ({count}); pick {axis} from the divisors of {count}"
        )


def validate_layout(layout: Layout, model: ModelSpec, num_gpus: int | None = None, cluster_name: str = "") -> None:
    """Every sharding degree must divide what it splits; the mesh must fill the cluster exactly."""
    if layout.tpssm > 1 and not model.has_mamba:
        raise MeshplanError(f"layout: tpssm splits Mamba blocks but {model.name} has none; use tp={layout.tpssm}")
    for axis, degree in (("tp", layout.tp), ("tpssm", layout.tpssm), ("tsp", layout.tsp)):
        if degree == 1:
            continue
        if model.attention is not None:
            _divides(degree, model.attention.heads, f"{model.name}'s attention heads", axis)
            _divides(degree, model.attention.kv_heads, f"{model.name}'s KV heads", axis)
        if model.mlp is not None:
            _divides(degree, model.mlp.ffn_hidden, f"{model.name}'s FFN width", axis)
        if model.mamba2 is not None:
            _divides(degree, model.mamba2.nheads, f"{model.name}'s Mamba-2 heads", axis)
            groups = model.mamba2.ngroups
            if axis != "tsp" and groups % degree and degree % groups:
                raise MeshplanError(
                    f"layout: {axis}={degree} and {model.name}'s Mamba-2 ngroups ({groups}) must divide one another "
                    f"(B/C groups are split, or replicated to the ranks whose heads use them)"
                )
        if model.mamba1 is not None:
            _divides(degree, model.mamba1.d_inner, f"{model.name}'s d_inner", axis)
        if model.moe is not None and axis == "tsp" and layout.ep == 1:
            raise MeshplanError(
                f"layout: tsp streams whole layers and does not split {model.name}'s experts; add ep "
                f"(the experts split over the tsp and dp ranks), or use tp"
            )
        if model.moe is not None and not layout.etp and axis != "tsp":  # the experts split as tp (default ETP)
            _divides(degree, model.moe.expert_ffn, f"{model.name}'s expert FFN width", axis)
    if layout.ep > 1 or layout.etp:
        _validate_experts(layout, model)
    if layout.pp > model.layers:
        # Uneven stages are fine (meshplan.costmodel.pipeline.pipeline_stages); more stages than layers are not.
        raise MeshplanError(
            f"layout: pp={layout.pp} exceeds {model.name}'s {model.layers} layers; use pp <= {model.layers}"
        )
    if num_gpus is not None and layout.world_size != num_gpus:
        where = f"cluster {cluster_name}" if cluster_name else "the cluster"
        raise MeshplanError(
            f"layout {layout} uses {layout.world_size} GPUs but {where} has {num_gpus}; "
            f"make dp×pp×tp×sp×tsp×tpssm = {num_gpus}"
        )


def _validate_experts(layout: Layout, model: ModelSpec) -> None:
    """ep and etp: the experts' decomposition etp × ep × edp of a stage's tp × sp × dp ranks."""
    axis = "ep" if layout.ep > 1 else "etp"
    if model.moe is None:
        raise MeshplanError(f"layout: {axis} splits experts and {model.name} has none; leave {axis} out")
    if layout.tsp > 1 and layout.expert_tensor_degree > 1:
        raise MeshplanError("layout: under tsp the experts are split by ep alone; leave etp out (etp = 1)")
    _divides(layout.ep, model.moe.experts, f"{model.name}'s experts", "ep")
    etp = layout.expert_tensor_degree
    _divides(etp, model.moe.expert_ffn, f"{model.name}'s expert FFN width", "etp")
    ranks = layout.stage_ranks
    if ranks % (etp * layout.ep):
        raise MeshplanError(
            f"layout: etp×ep = {etp}×{layout.ep} must divide a stage's tp×sp×dp = {ranks} ranks "
            f"(the experts fold onto them); pick etp×ep from the divisors of {ranks}"
        )


def validate_seq(layout: Layout, seq: int, batch: int) -> None:
    if seq < 1:
        raise MeshplanError(f"--seq must be >= 1, got {seq}")
    if batch < 1:
        raise MeshplanError(f"--batch must be >= 1, got {batch}")
    if layout.sp > 1:
        _divides(layout.sp, seq, "the sequence length", "sp")
    if layout.tsp > 1 and seq % (2 * layout.tsp):
        raise MeshplanError(
            f"layout: tsp={layout.tsp} splits the sequence into 2·{layout.tsp} zigzag chunks, which must divide "
            f"--seq ({seq}); use a multiple of {2 * layout.tsp}"
        )


def validate_int8_allreduce(layouts: list[Layout] | None, model: ModelSpec) -> None:
    """--int8-allreduce quantizes TP-SSM's block all-reduce (meshplan.costmodel.axes.tp): a model
    without Mamba blocks, or `layouts` without a tpssm axis (None: the planner's, which has them),
    would run and price it in bf16 as if the flag were not there — one line instead."""
    if not model.has_mamba:
        raise MeshplanError(
            f"--int8-allreduce: it quantizes TP-SSM's all-reduce in Mamba blocks, and {model.name} has none; drop it"
        )
    if layouts is not None and not any(layout.tpssm > 1 for layout in layouts):
        given = ", ".join(str(layout) for layout in layouts)
        raise MeshplanError(
            f"--int8-allreduce: it quantizes the tpssm axis's all-reduce, and {given} has no tpssm axis; "
            f"use a layout with tpssm=N (e.g. tpssm=2) or drop the flag"
        )


def sp_zigzag(layout: Layout, seq: int, attention_only: bool) -> bool:
    """Whether the sequence axis deals the tokens out in zigzag — 2Σ chunks, rank i taking chunks i
    and 2Σ−1−i — so that every rank does the same causal attention work (as TSP does, and as
    Megatron-LM's context parallelism balances it): for stacks of attention layers only, where 2Σ
    divides the length. Mamba layers keep contiguous shards: their state passes from one shard to
    the next. The executor and the cost model both ask here."""
    return layout.sp > 1 and attention_only and seq % (2 * layout.sp) == 0

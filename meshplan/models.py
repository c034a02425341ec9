"""Model shapes: frozen dataclasses validated on construction, and named presets.

A model is a stack of blocks. Dense decoders are `layers` × (attention + MLP); Mamba models are
`layers` × Mamba block; a Zamba-style hybrid is `layers` Mamba-2 blocks with a shared transformer
block (attention + MLP, a few distinct copies reused in turn) invoked after every k-th Mamba block; a
mixture of experts is attention + (router, routed experts, shared experts) a layer, some layers keeping
a dense MLP; a mixed model (Nemotron-H, Granite 4.0-H, Jamba) lists each layer's blocks. The cost
model walks `model.layer_blocks()` and `model.block_invocations()`; parameter counts come from
`param_count()`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field, replace

from meshplan.errors import MeshplanError

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


def frozen_hash(obj) -> int:
    """A frozen dataclass's hash, computed once (the cost model's caches key on models, layouts and
    options, asked for thousands of times a ranking). Use as `__hash__ = frozen_hash` in the class."""
    cached = obj.__dict__.get("_hash")
    if cached is None:
        cached = hash(tuple(getattr(obj, f.name) for f in dataclasses.fields(obj) if f.compare))
        object.__setattr__(obj, "_hash", cached)
    return cached


def dtype_bytes(name: str, field_name: str = "dtype") -> int:
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise MeshplanError(f"{field_name}: unknown dtype {name!r}; use one of {', '.join(DTYPE_BYTES)}") from None


def _positive(owner: str, **values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise MeshplanError(f"{owner}.{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class RopeSpec:
    """Rotary position frequencies (transformers' rope_theta and rope_scaling / rope_parameters). They
    change no cost; the executor's rotary embedding uses them, so loaded weights give the model's loss.
    `kind`: "default"; "linear" (positions / factor); "llama3" (Llama 3.1's low / high frequency
    bands, transformers' _compute_llama3_parameters); "none": no rotary positions at all (Nemotron-H's
    attention, transformers' NemotronHAttention); any other kind is priced and not executed."""

    theta: float = 10000.0
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192

    EXECUTED = ("default", "linear", "llama3", "none")


@dataclass(frozen=True)
class AttentionSpec:
    """Multi-head / grouped-query attention with a pre-norm, or multi-head latent attention (MLA:
    DeepSeek-V2/V3, when kv_lora_rank > 0). Widths in elements.

    MLA (transformers' DeepseekV3Attention; DeepSeek-V2 report §2.1): queries come from the hidden state
    through a q_lora_rank latent and its norm (or one projection when q_lora_rank is 0); keys and values
    come up from a kv_lora_rank latent and its norm, beside one rope_head_dim key that every head
    shares. `head_dim` is then a query/key head (qk_nope_head_dim + rope_head_dim), `kv_heads` = `heads`,
    and each value head is v_head_dim wide."""

    hidden: int  # input width (Zamba2's shared block reads concat(hidden, embedding) = 2·d_model)
    heads: int
    kv_heads: int
    head_dim: int
    out_hidden: int  # W_O's output width (Zamba2's shared block: d_model, though it reads 2·d_model)
    bias: bool = False  # GPT-2 / NeoX / OPT style: biases on the QKV and output projections (MLA: q_a, kv_a, o)
    qkv_bias: bool = False  # Qwen2: biases on Q, K and V only
    qk_norm: int = 0  # scale elements of the query / key norms (Qwen3, Gemma3: 2·head_dim; OLMo2: q + kv width)
    post_norm: bool = False  # a norm of the block's output too (Gemma2/3)
    sinks: bool = False  # gpt-oss: one learned logit a head that every softmax sees (GptOssAttention.sinks)
    kv_lora_rank: int = 0  # MLA: the K/V latent's width (0: not MLA)
    q_lora_rank: int = 0  # MLA: the query latent's width (0: queries projected from the hidden state directly)
    rope_head_dim: int = 0  # MLA: the rotary part of each query/key head, and the width of the shared rope key
    v_head_dim: int = 0  # MLA: each value head's width

    def __post_init__(self) -> None:
        _positive(
            "attention",
            hidden=self.hidden,
            heads=self.heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            out_hidden=self.out_hidden,
        )
        if self.heads % self.kv_heads:
            raise MeshplanError(
                f"attention.kv_heads ({self.kv_heads}) must divide heads ({self.heads}); pick a divisor of heads"
            )
        if self.kv_lora_rank:
            self._check_mla()
        elif self.q_lora_rank or self.rope_head_dim or self.v_head_dim:
            raise MeshplanError(
                "attention: q_lora_rank, rope_head_dim and v_head_dim belong to latent attention; "
                "give kv_lora_rank too, or leave them 0"
            )

    def _check_mla(self) -> None:
        _positive(
            "attention",
            kv_lora_rank=self.kv_lora_rank,
            rope_head_dim=self.rope_head_dim,
            v_head_dim=self.v_head_dim,
        )
        if self.q_lora_rank:
            _positive("attention", q_lora_rank=self.q_lora_rank)
        if self.rope_head_dim >= self.head_dim:
            raise MeshplanError(
                f"attention.rope_head_dim ({self.rope_head_dim}) must be less than head_dim ({self.head_dim}), "
                "which is the nope part plus the rope part"
            )
        if self.kv_heads != self.heads:
            raise MeshplanError(
                f"attention.kv_heads ({self.kv_heads}): latent attention brings K and V up for every head; "
                f"set kv_heads = heads ({self.heads})"
            )

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """h_kv = a_kv · d: the width of K (and of V, but for MLA's value heads: value_width)."""
        return self.kv_heads * self.head_dim

    @property
    def value_width(self) -> int:
        """The width of V: kv_width, or MLA's heads · v_head_dim."""
        return self.heads * self.v_head_dim if self.mla else self.kv_width

    @property
    def kv_pair_width(self) -> int:
        """K and V of a token, up-projected (what training saves and a sequence split gathers)."""
        return self.kv_width + self.value_width

    @property
    def out_width(self) -> int:
        """The attention core's output, W_O's input: q_width, or MLA's heads · v_head_dim."""
        return self.heads * self.v_head_dim if self.mla else self.q_width

    @property
    def core_width(self) -> float:
        """Half the width of the core's two matmuls a query-key pair (QKᵀ over query/key heads, PV over
        value heads): the core costs 4·queries·keys·core_width FLOPs."""
        return (self.q_width + self.out_width) / 2 if self.mla else self.q_width

    @property
    def kv_cache_width(self) -> int:
        """Elements one token keeps in one layer's KV cache: K and V, or for MLA the K/V latent and the
        shared rope key — what vLLM and SGLang cache for DeepSeek, absorbing the up-projections into
        the query and the output (DeepSeek-V2 report §2.1.2)."""
        return self.kv_lora_rank + self.rope_head_dim if self.mla else 2 * self.kv_width

    @property
    def kv_cache_split_by_heads(self) -> bool:
        """Whether a head split divides the KV cache: MLA's latent serves every head, so each tensor
        rank keeps all of it."""
        return not self.mla

    @property
    def decode_core_width(self) -> float:
        """core_width of a decode step over the cache: MLA's absorbed attention scores the query against
        the latent and rope key (kv_lora_rank + rope_head_dim a head) and sums the latents
        (kv_lora_rank a head)."""
        if not self.mla:
            return self.q_width
        return self.heads * (2 * self.kv_lora_rank + self.rope_head_dim) / 2

    def down_projection_params(self) -> int:
        """MLA's down-projections to the latents (q_a, kv_a) with their biases: Megatron-Core keeps them
        whole on every tensor rank (multi_latent_attention.py, MLASelfAttention: linear_q_down_proj and
        linear_kv_down_proj built parallel_mode='duplicated'); 0 for other attention."""
        if not self.mla:
            return 0
        widths = self.q_lora_rank + self.kv_lora_rank + self.rope_head_dim
        return self.hidden * widths + (widths if self.bias else 0)

    def largest_projection(self) -> int:
        """Elements of the block's largest weight matrix (the fused QKV; for MLA the largest of q / q_b,
        kv_b and o)."""
        if not self.mla:
            return (self.q_width + 2 * self.kv_width) * self.hidden
        q_in = self.q_lora_rank or self.hidden
        kv_up = self.kv_lora_rank * (self.heads * (self.head_dim - self.rope_head_dim) + self.value_width)
        return max(q_in * self.q_width, kv_up, self.out_width * self.out_hidden)

    def param_count(self) -> int:
        # W_Q, W_K, W_V, W_O (with their biases if any), and the pre-norm's scale.
        sinks = self.heads if self.sinks else 0
        if self.mla:
            return self._mla_projection_params() + self.hidden + self.norm_extra + sinks
        biases = self.q_width + 2 * self.kv_width + self.out_hidden if self.bias else 0
        if self.qkv_bias and not self.bias:
            biases = self.q_width + 2 * self.kv_width
        return (
            self.hidden * (self.q_width + 2 * self.kv_width)
            + self.q_width * self.out_hidden
            + biases
            + self.hidden
            + self.norm_extra
            + sinks
        )

    def _mla_projection_params(self) -> int:
        """q (or q_a, q_b), kv_a, kv_b and o, with the biases attention_bias puts on q_a, kv_a and o
        (transformers' DeepseekV3Attention)."""
        nope = self.head_dim - self.rope_head_dim
        q_up = self.q_lora_rank * self.q_width if self.q_lora_rank else self.hidden * self.q_width
        kv_up = self.kv_lora_rank * self.heads * (nope + self.v_head_dim)
        o = self.out_width * self.out_hidden + (self.out_hidden if self.bias else 0)
        return self.down_projection_params() + q_up + kv_up + o

    @property
    def norm_extra(self) -> int:
        """Norm scales beside the pre-norm: the query / key norms, the output norm, MLA's latent norms."""
        latent = self.q_lora_rank + self.kv_lora_rank if self.mla else 0
        return self.qk_norm + (self.out_hidden if self.post_norm else 0) + latent


@dataclass(frozen=True)
class MlpSpec:
    hidden: int
    ffn_hidden: int
    gated: bool = True  # SwiGLU: gate and up (h × F·h each) and down (F·h × h); False: GPT's fc1, GeLU, fc2
    out_hidden: int = 0  # 0: same as hidden
    bias: bool = False  # biases on both projections (GPT-2, NeoX, OPT)
    post_norm: bool = False  # a norm of the block's output too (Gemma2/3)
    relu2: bool = False  # ungated: a squared ReLU instead of GeLU (Nemotron-H's mlp_hidden_act "relu2")
    geglu: bool = False  # gated: an exact GeLU of the gate instead of SiLU (Zamba2's hidden_act "gelu")

    def __post_init__(self) -> None:
        _positive("mlp", hidden=self.hidden, ffn_hidden=self.ffn_hidden)
        if self.out_hidden == 0:
            object.__setattr__(self, "out_hidden", self.hidden)

    @property
    def n_input_matrices(self) -> int:
        return 2 if self.gated else 1

    def param_count(self) -> int:
        biases = self.n_input_matrices * self.ffn_hidden + self.out_hidden if self.bias else 0
        return (
            self.n_input_matrices * self.hidden * self.ffn_hidden
            + self.ffn_hidden * self.out_hidden
            + biases
            + self.hidden
            + self.norm_extra
        )

    @property
    def norm_extra(self) -> int:
        return self.out_hidden if self.post_norm else 0


@dataclass(frozen=True)
class MoeSpec:
    """A mixture-of-experts MLP: a router over `experts` routed experts, each token sent to `top_k`
    of them, and optionally shared experts every token runs (`shared_ffn` wide in all; Qwen2-MoE gates
    theirs with a sigmoid of a hidden → 1 projection). `gated`: SwiGLU experts (gate, up, down), else
    two matrices (Nemotron-H's squared-ReLU up and down), shared experts alike.

    The router's choice changes no shape and no cost: `score` "softmax" (Mixtral, Qwen) or "sigmoid"
    (DeepSeek-V3, Nemotron-H: transformers' NemotronHTopkRouter — experts chosen by sigmoid + a
    correction bias kept as a buffer, among the `topk_groups` of `expert_groups` groups whose two best
    scores sum highest; weighted by their sigmoid, renormalised where norm_topk, times `routed_scaling`)."""

    hidden: int
    experts: int
    top_k: int
    expert_ffn: int  # each routed expert's intermediate width
    gated: bool = True  # SwiGLU experts (gate, up, down)
    shared_ffn: int = 0  # the shared experts' total intermediate width (0: none)
    shared_gate: bool = False
    expert_bias: bool = False  # gpt-oss: biases on each routed expert's gate/up and down projections
    router_bias: bool = False  # gpt-oss: a bias on the router's logits
    norm_topk: bool = True  # the top_k probabilities renormalised to sum to one (Mixtral; Qwen's norm_topk_prob)
    score: str = "softmax"  # "softmax" | "sigmoid" (the router's scores)
    expert_groups: int = 1  # n_group: the experts in groups, ...
    topk_groups: int = 1  # ... topk_group of them searched for a token's top_k
    routed_scaling: float = 1.0  # routed_scaling_factor: the routed experts' weights scaled

    def __post_init__(self) -> None:
        _positive("moe", hidden=self.hidden, experts=self.experts, top_k=self.top_k, expert_ffn=self.expert_ffn)
        if self.top_k > self.experts:
            raise MeshplanError(f"moe: top_k ({self.top_k}) exceeds the {self.experts} experts; use top_k <= experts")
        if self.score not in ("softmax", "sigmoid"):
            raise MeshplanError(f"moe.score: unknown {self.score!r}; use softmax or sigmoid")
        _positive("moe", expert_groups=self.expert_groups, topk_groups=self.topk_groups)
        if self.experts % self.expert_groups or self.topk_groups > self.expert_groups:
            raise MeshplanError(
                f"moe: {self.expert_groups} expert groups must divide the {self.experts} experts and hold "
                f"topk_groups ({self.topk_groups}); pick n_group among the experts' divisors"
            )

    @property
    def n_input_matrices(self) -> int:
        return 2 if self.gated else 1

    def expert_params(self) -> int:
        """One routed expert's weights (and biases)."""
        biases = self.n_input_matrices * self.expert_ffn + self.hidden if self.expert_bias else 0
        return (self.n_input_matrices + 1) * self.hidden * self.expert_ffn + biases

    def router_params(self) -> int:
        """The router's projection (and bias) and the MoE layer's pre-norm scale."""
        return self.hidden * self.experts + self.hidden + (self.experts if self.router_bias else 0)

    def shared_params(self) -> int:
        if not self.shared_ffn:
            return 0
        return (self.n_input_matrices + 1) * self.hidden * self.shared_ffn + (self.hidden if self.shared_gate else 0)

    def param_count(self) -> int:
        return self.router_params() + self.experts * self.expert_params() + self.shared_params()

    def active_params(self) -> int:
        """What one token runs: the router, its top_k experts, the shared experts."""
        return self.router_params() + self.top_k * self.expert_params() + self.shared_params()


@dataclass(frozen=True)
class Mamba2Spec:
    """Mamba-2 mixer (Dao & Gu 2024; mamba_ssm `Mamba2`): in_proj → conv1d on xBC → SSD scan →
    gated RMSNorm → out_proj, behind a pre-norm."""

    d_model: int
    d_state: int = 128
    expand: int = 2
    headdim: int = 64
    ngroups: int = 1
    d_conv: int = 4
    chunk_size: int = 256
    # the heads' total width when it is not expand·d_model (Nemotron-H: mamba_num_heads · mamba_head_dim,
    # 4096 beside a d_model of 2688 in Nemotron 3 Nano); 0: expand·d_model
    d_inner_width: int = 0

    def __post_init__(self) -> None:
        if self.d_inner_width:
            _positive("mamba2", d_inner_width=self.d_inner_width)
        _positive(
            "mamba2",
            d_model=self.d_model,
            d_state=self.d_state,
            expand=self.expand,
            headdim=self.headdim,
            ngroups=self.ngroups,
            d_conv=self.d_conv,
            chunk_size=self.chunk_size,
        )
        if self.d_inner % self.headdim:
            raise MeshplanError(f"mamba2.headdim ({self.headdim}) must divide d_inner ({self.d_inner})")
        if self.nheads % self.ngroups:
            raise MeshplanError(f"mamba2.ngroups ({self.ngroups}) must divide nheads ({self.nheads})")

    @property
    def d_inner(self) -> int:
        return self.d_inner_width or self.expand * self.d_model

    @property
    def nheads(self) -> int:
        return self.d_inner // self.headdim

    @property
    def conv_dim(self) -> int:
        """Channels through the causal conv: x, B and C."""
        return self.d_inner + 2 * self.ngroups * self.d_state

    @property
    def in_proj_width(self) -> int:
        """z, x, B, C, dt packed: 2·d_inner + 2·ngroups·d_state + nheads (docs/design.md §3)."""
        return 2 * self.d_inner + 2 * self.ngroups * self.d_state + self.nheads

    def param_count(self) -> int:
        in_proj = self.d_model * self.in_proj_width
        conv = self.conv_dim * self.d_conv + self.conv_dim  # depthwise weight + bias
        per_head = 3 * self.nheads  # A_log, D, dt_bias
        out_proj = self.d_inner * self.d_model
        return in_proj + conv + per_head + self.d_inner + out_proj + self.d_model  # + gated norm + pre-norm


@dataclass(frozen=True)
class Mamba1Spec:
    """Mamba-1 mixer (Gu & Dao 2023): in_proj → conv1d → x_proj (dt, B, C from all channels) →
    dt_proj → selective scan → gate → out_proj. Falcon-Mamba is Mamba-1."""

    d_model: int
    d_state: int = 16
    expand: int = 2
    dt_rank: int = 0  # 0: ceil(d_model / 16), mamba_ssm's "auto"
    d_conv: int = 4
    dt_bc_norms: bool = False  # Jamba: RMSNorm scales on dt, B and C (transformers' JambaMambaMixer)

    def __post_init__(self) -> None:
        if self.dt_rank == 0:
            object.__setattr__(self, "dt_rank", math.ceil(self.d_model / 16))
        _positive(
            "mamba1",
            d_model=self.d_model,
            d_state=self.d_state,
            expand=self.expand,
            dt_rank=self.dt_rank,
            d_conv=self.d_conv,
        )

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def x_proj_width(self) -> int:
        return self.dt_rank + 2 * self.d_state

    def param_count(self) -> int:
        di = self.d_inner
        in_proj = self.d_model * 2 * di
        conv = di * self.d_conv + di
        x_proj = di * self.x_proj_width
        dt_proj = self.dt_rank * di + di
        a_and_d = di * self.d_state + di
        out_proj = di * self.d_model
        return in_proj + conv + x_proj + dt_proj + a_and_d + out_proj + self.d_model + self.inner_norm_params()

    def inner_norm_params(self) -> int:
        """Scales of Jamba's norms on dt, B and C (0 for Mamba and Falcon-Mamba)."""
        return self.dt_rank + 2 * self.d_state if self.dt_bc_norms else 0


# The block kinds a mixed model's layers may run, and the spec each reads (its weights, its shapes).
MIXED_KIND_SPECS = {
    "attention": "attention",
    "mlp": "mlp",
    "mamba2": "mamba2",
    "mamba1": "mamba1",
    "router": "moe",
    "experts": "moe",
    "shared_expert": "moe",
}


# Nemotron-H's hybrid_override_pattern, one character a layer (transformers' NemotronHConfig._pattern_to_list):
# M a Mamba-2 mixer, * attention, - an MLP, E a mixture of experts with its shared expert.
NEMOTRON_H_KINDS = {
    "M": ("mamba2",),
    "*": ("attention",),
    "-": ("mlp",),
    "E": ("router", "experts", "shared_expert"),
}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str  # "dense" | "mamba2" | "mamba1" | "hybrid" | "moe" | "mixed"
    d_model: int
    layers: int
    vocab: int
    tied_embeddings: bool = False
    param_dtype: str = "bf16"
    attention: AttentionSpec | None = None
    mlp: MlpSpec | None = None
    mamba2: Mamba2Spec | None = None
    mamba1: Mamba1Spec | None = None
    moe: MoeSpec | None = None
    # moe: the layers (0-based) whose MLP is dense (`mlp`) rather than a mixture of experts (DeepSeek's
    # first layers, Qwen's mlp_only_layers)
    dense_layer_ids: tuple[int, ...] = ()
    hybrid_layers: int = 0  # hybrid: how many Mamba layers are followed by a shared-block invocation
    # hybrid: which layers (0-based) invoke the shared block (config.json layers_block_type); (): spread
    # evenly, the last layer one of them
    hybrid_layer_ids: tuple[int, ...] = ()
    shared_blocks: int = 0  # hybrid: distinct copies of the shared block, used in turn (ABAB…)
    adapter_rank: int = 0  # hybrid: rank of each invocation's own LoRA adapter on the shared MLP's gate/up (0: none)
    attention_adapters: bool = False  # hybrid: adapters of that rank on the shared Q, K and V too
    norm: str = "rmsnorm"  # "rmsnorm" | "layernorm" (LayerNorm has a bias beside its scale)
    positions: str = "rotary"  # "rotary" | "learned" (GPT-2 / OPT: a max_positions × d_model table)
    max_positions: int = 0  # rows of the learned position table
    attention_window: int = 0  # sliding-window attention: keys a query sees (0: all before it)
    window_layers: int = 0  # attention layers that use the window (Gemma2: every other; Mistral v0.1: all)
    rope: RopeSpec = field(default_factory=RopeSpec)
    norm_eps: float = 1e-5  # RMSNorm's epsilon (config.json rms_norm_eps / layer_norm_epsilon)
    # mixed: each layer's block kinds, in order (Nemotron-H, Granite 4.0-H, Jamba: Mamba, attention, MLP and
    # MoE layers with no shared weights); each block brings its own pre-norm (the router the MoE's)
    layer_kinds: tuple[tuple[str, ...], ...] = ()
    # DeepSeek-V3's multi-token prediction: the last mtp_layers of `layers` are MTP modules (each a
    # layer like the last, an eh_proj 2·d_model → d_model and three norms; embedding and head shared with
    # the model). Transformers builds none; priced as layers when set (0: none).
    mtp_layers: int = 0
    source: str = field(default="", compare=False)

    __hash__ = frozen_hash

    def __post_init__(self) -> None:
        _positive(f"model {self.name}", d_model=self.d_model, layers=self.layers, vocab=self.vocab)
        dtype_bytes(self.param_dtype, "model.param_dtype")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise MeshplanError(f"model.norm: unknown {self.norm!r}; use rmsnorm or layernorm")
        if self.positions not in ("rotary", "learned"):
            raise MeshplanError(f"model.positions: unknown {self.positions!r}; use rotary or learned")
        if self.positions == "learned":
            _positive(f"model {self.name}", max_positions=self.max_positions)
        need = {
            "dense": ("attention", "mlp"),
            "mamba2": ("mamba2",),
            "mamba1": ("mamba1",),
            "hybrid": ("mamba2", "attention", "mlp"),
            "moe": ("attention", "moe"),
            "mixed": (),
        }
        if self.family not in need:
            raise MeshplanError(f"model.family: unknown {self.family!r}; use one of {', '.join(need)}")
        for part in need[self.family]:
            if getattr(self, part) is None:
                raise MeshplanError(f"model {self.name}: family {self.family} needs a {part} spec")
        self._check_layer_kinds()
        if not isinstance(self.mtp_layers, int) or isinstance(self.mtp_layers, bool) or self.mtp_layers < 0:
            raise MeshplanError(
                f"model {self.name}: mtp_layers must be a non-negative integer, got {self.mtp_layers!r}"
            )
        if self.mtp_layers and (self.family not in ("dense", "moe") or self.mtp_layers >= self.layers):
            raise MeshplanError(
                f"model {self.name}: mtp_layers ({self.mtp_layers}) are the last layers of a dense or moe "
                f"model, fewer than its {self.layers}; leave it 0 for family {self.family}"
            )
        if self.window_layers:
            _positive(f"model {self.name}", attention_window=self.attention_window)
            if self.window_layers > self.attention_layers:
                raise MeshplanError(
                    f"model {self.name}: window_layers ({self.window_layers}) exceeds the "
                    f"{self.attention_layers} attention layers"
                )
        if self.family == "hybrid":
            _positive(f"model {self.name}", hybrid_layers=self.hybrid_layers, shared_blocks=self.shared_blocks)
            if self.hybrid_layers > self.layers:
                raise MeshplanError(
                    f"model {self.name}: hybrid_layers ({self.hybrid_layers}) exceeds layers ({self.layers})"
                )
            ids = self.hybrid_layer_ids
            if ids and (
                len(ids) != self.hybrid_layers
                or list(ids) != sorted(set(ids))
                or not 0 <= ids[0] <= ids[-1] < self.layers
            ):
                raise MeshplanError(
                    f"model {self.name}: hybrid_layer_ids must be {self.hybrid_layers} distinct layers in "
                    f"0..{self.layers - 1}, in order; got {list(ids)}"
                )
        if not isinstance(self.adapter_rank, int) or isinstance(self.adapter_rank, bool) or self.adapter_rank < 0:
            raise MeshplanError(
                f"model {self.name}: adapter_rank must be a non-negative integer (0: no adapters), "
                f"got {self.adapter_rank!r}"
            )
        if (self.adapter_rank or self.attention_adapters) and self.family != "hybrid":
            raise MeshplanError(
                f"model {self.name}: adapter_rank and attention_adapters belong to a hybrid's shared block; "
                f"family {self.family} has none — leave them at 0 / False"
            )

    def _check_layer_kinds(self) -> None:
        """A mixed model's layers: one entry a layer, each a non-empty tuple of known block kinds whose
        specs the model has; routed experts behind their router; Mamba-2 or Mamba-1, not both."""
        if self.family != "mixed":
            if self.layer_kinds:
                raise MeshplanError(
                    f"model {self.name}: layer_kinds lists a mixed model's layers; family {self.family} "
                    "derives its own — leave it empty"
                )
            return
        kinds = tuple(tuple(layer) for layer in self.layer_kinds)
        object.__setattr__(self, "layer_kinds", kinds)  # hashable, whatever sequences it was given as
        if len(kinds) != self.layers:
            raise MeshplanError(
                f"model {self.name}: layer_kinds has {len(kinds)} layers but layers is {self.layers}; "
                "give one tuple of block kinds a layer"
            )
        for i, layer in enumerate(kinds):
            if not layer:
                raise MeshplanError(f"model {self.name}: layer_kinds[{i}] is empty; give each layer its block kinds")
            for kind in layer:
                if kind not in MIXED_KIND_SPECS:
                    raise MeshplanError(
                        f"model {self.name}: layer_kinds[{i}] names unknown block kind {kind!r}; "
                        f"use {', '.join(MIXED_KIND_SPECS)}"
                    )
                if getattr(self, MIXED_KIND_SPECS[kind]) is None:
                    raise MeshplanError(
                        f"model {self.name}: layer_kinds[{i}] runs {kind} but the model has no "
                        f"{MIXED_KIND_SPECS[kind]} spec; give one"
                    )
            if ("experts" in layer) != ("router" in layer) or ("shared_expert" in layer and "router" not in layer):
                raise MeshplanError(
                    f"model {self.name}: layer_kinds[{i}] = {layer}: a mixture of experts is a router and its "
                    "routed experts (and any shared expert) in one layer"
                )
        if self.mamba2 is not None and self.mamba1 is not None:
            raise MeshplanError(f"model {self.name}: a mixed model holds Mamba-2 or Mamba-1 blocks, not both")

    # -- structure ---------------------------------------------------------------------------
    @property
    def has_attention(self) -> bool:
        return self.attention is not None

    @property
    def has_mamba(self) -> bool:
        return self.mamba2 is not None or self.mamba1 is not None

    @property
    def hybrid_invocations(self) -> int:
        return self.hybrid_layers if self.family == "hybrid" else 0

    def layer_blocks(self) -> tuple[tuple[str, ...], ...]:
        """The model as an ordered list of layers, each the block kinds it runs (a dense layer:
        attention then MLP; a Zamba2 hybrid layer: its Mamba-2 block and an invocation of the shared
        block — attention, MLP and its own projection)."""
        return _layer_blocks(self)

    @property
    def uniform_layers(self) -> bool:
        """Every layer runs the same blocks (a pipeline stage is then its share of an average layer)."""
        return len(set(self.layer_blocks())) == 1

    def stage_block_counts(self, stage_layers: tuple[int, ...]) -> tuple[dict[str, int], ...]:
        """Invocations of each block kind on each pipeline stage of `stage_layers` consecutive layers
        (computed once for a model and its stages: read them, do not change them)."""
        return _stage_block_counts(self, tuple(stage_layers))

    def shared_block_kinds(self) -> tuple[str, ...]:
        """Block kinds whose weights are shared by the layers that invoke them (Zamba2's shared block)."""
        return ("attention", "mlp") if self.family == "hybrid" else ()

    def _hybrid_ids(self) -> tuple[int, ...]:
        if self.hybrid_layer_ids:
            return self.hybrid_layer_ids
        h = self.hybrid_invocations
        return tuple((k + 1) * self.layers // h - 1 for k in range(h)) if h else ()

    def block_invocations(self) -> tuple[tuple[str, int], ...]:
        """(block kind, times it runs per forward pass). Activations scale with these counts."""
        if self.family == "dense":
            return (("attention", self.layers), ("mlp", self.layers))
        if self.family == "mamba2":
            return (("mamba2", self.layers),)
        if self.family == "mamba1":
            return (("mamba1", self.layers),)
        if self.family in ("moe", "mixed"):
            return _layered_invocations(self)
        n = self.hybrid_invocations
        return (("mamba2", self.layers), ("attention", n), ("mlp", n), ("hybrid_proj", n))

    @property
    def attention_layers(self) -> int:
        """Attention invocations per forward pass (each keeps its own KV cache)."""
        return dict(self.block_invocations()).get("attention", 0)

    @property
    def mamba_layers(self) -> int:
        counts = dict(self.block_invocations())
        return counts.get("mamba2", 0) + counts.get("mamba1", 0)

    # -- parameters ----------------------------------------------------------------------------
    @property
    def norm_elements(self) -> int:
        """Parameters a norm holds per channel: a scale, and LayerNorm's bias."""
        return 2 if self.norm == "layernorm" else 1

    def position_params(self) -> int:
        return self.max_positions * self.d_model if self.positions == "learned" else 0

    def embedding_params(self) -> int:
        """Token embedding, output head (unless tied), learned positions and the final norm."""
        heads = 1 if self.tied_embeddings else 2
        return heads * self.vocab * self.d_model + self.position_params() + self.norm_elements * self.d_model

    def layer_params(self) -> int:
        """Parameters of all blocks (shared hybrid blocks counted once per distinct copy); a block spec
        counts its pre-norm's scale, and LayerNorm's biases are added here."""
        return (
            self._block_params()
            + self.mtp_params()
            + (self.norm_elements - 1) * self.norm_params(embeddings=False, scales_only=True)
        )

    def _block_params(self) -> int:
        if self.family == "dense":
            return self.layers * (self.attention.param_count() + self.mlp.param_count())
        if self.family == "mamba2":
            return self.layers * self.mamba2.param_count()
        if self.family == "mamba1":
            return self.layers * self.mamba1.param_count()
        if self.family == "moe":
            dense = len(self.dense_layer_ids)
            mlp = dense * self.mlp.param_count() if dense else 0
            return self.layers * self.attention.param_count() + mlp + (self.layers - dense) * self.moe.param_count()
        if self.family == "mixed":
            return sum(n * self._kind_params(kind) for kind, n in self.block_invocations())
        shared = self.shared_blocks * (self.attention.param_count() + self.mlp.param_count())
        return self.layers * self.mamba2.param_count() + shared + self.hybrid_invocations * self.hybrid_proj_params()

    def _kind_params(self, kind: str) -> int:
        """One block of a mixed model's `kind`: its spec's count, or the MoE's share of it."""
        if kind == "router":
            return self.moe.router_params()
        if kind == "experts":
            return self.moe.experts * self.moe.expert_params()
        if kind == "shared_expert":
            return self.moe.shared_params()
        return getattr(self, kind).param_count()

    def mtp_params(self) -> int:
        """What each multi-token-prediction module adds beside its layer (DeepSeek-V3 report §2.2): the
        projection of [norm(h), norm(embedding)] back to d_model, its two norms and the norm before the
        shared head."""
        return self.mtp_layers * (2 * self.d_model * self.d_model + 3 * self.d_model)

    def hybrid_proj_params(self) -> int:
        """Zamba2: the weights each hybrid layer owns, beside the shared block it invokes — a linear from
        the block's output back to d_model (transformers' Zamba2HybridLayer.linear) and its adapters."""
        if self.family != "hybrid":
            return 0
        return self.mlp.out_hidden * self.d_model + self.adapter_params()

    def adapter_params(self) -> int:
        """One hybrid invocation's LoRA adapters (transformers' modeling_zamba2.py): on the shared MLP's
        gate/up, d_model → rank → the gate and up widths (Zamba2MLP.gate_up_proj_adapter_list); with
        `attention_adapters`, on Q, K and V, each attention input → rank → attention input
        (Zamba2Attention.linear_{q,k,v}_adapter_list)."""
        rank = self.adapter_rank
        if self.family != "hybrid" or not rank:
            return 0
        mlp = rank * (self.mlp.hidden + self.mlp.n_input_matrices * self.mlp.ffn_hidden)
        attention = 3 * rank * 2 * self.attention.hidden if self.attention_adapters else 0
        return mlp + attention

    def param_count(self) -> int:
        return self.embedding_params() + self.layer_params()

    def active_param_count(self) -> int:
        """Parameters a token runs through: all but the routed experts it is not sent to."""
        if self.moe is None:
            return self.param_count()
        sparse = dict(self.block_invocations()).get("experts", 0)  # the layers that route
        return self.param_count() - sparse * (self.moe.experts - self.moe.top_k) * self.moe.expert_params()

    def norm_params(self, embeddings: bool = True, scales_only: bool = False) -> int:
        """Norm parameters (scales, and LayerNorm's biases unless `scales_only`): tiny, and replicated on
        every rank of a tensor / TSP axis (never split)."""
        return _norm_params(self, embeddings, scales_only)

    def windowed_share(self, keys: int) -> float:
        """The share of attention invocations whose window is shorter than `keys`."""
        if not self.window_layers or self.attention_window >= keys:
            return 0.0
        return self.window_layers / self.attention_layers

    def _norm_params(self, embeddings: bool, scales_only: bool) -> int:
        per_kind = {
            "attention": self.attention.hidden + self.attention.norm_extra if self.attention else 0,
            "mlp": self.mlp.hidden + self.mlp.norm_extra if self.mlp else 0,
            "mamba2": self.d_model,
            "mamba1": self.d_model + (self.mamba1.inner_norm_params() if self.mamba1 else 0),
            "router": self.moe.hidden if self.moe else 0,  # the MoE layer's pre-norm
        }
        if self.family == "hybrid":
            blocks = self.layers * self.d_model + self.shared_blocks * (per_kind["attention"] + per_kind["mlp"])
        else:
            blocks = sum(per_kind.get(kind, 0) * n for kind, n in self.block_invocations())
        blocks += 3 * self.d_model * self.mtp_layers  # each MTP module's norms (mtp_params)
        per_channel = 1 if scales_only else self.norm_elements
        return (blocks + (self.d_model if embeddings else 0)) * per_channel

    @property
    def param_bytes_per_element(self) -> int:
        return DTYPE_BYTES[self.param_dtype]


@functools.lru_cache(maxsize=256)
def _norm_params(model: ModelSpec, embeddings: bool, scales_only: bool) -> int:
    return model._norm_params(embeddings, scales_only)


@functools.lru_cache(maxsize=256)
def _layer_blocks(model: ModelSpec) -> tuple[tuple[str, ...], ...]:
    if model.family == "dense":
        return (("attention", "mlp"),) * model.layers
    if model.family in ("mamba2", "mamba1"):
        return ((model.family,),) * model.layers
    if model.family == "mixed":
        return model.layer_kinds
    if model.family == "moe":
        dense = set(model.dense_layer_ids)
        sparse = ("attention", "router", "experts") + (("shared_expert",) if model.moe.shared_ffn else ())
        return tuple(("attention", "mlp") if i in dense else sparse for i in range(model.layers))
    shared = set(model._hybrid_ids())
    return tuple(
        ("mamba2", "attention", "mlp", "hybrid_proj") if i in shared else ("mamba2",) for i in range(model.layers)
    )


@functools.lru_cache(maxsize=4096)
def _stage_block_counts(model: ModelSpec, stage_layers: tuple[int, ...]) -> tuple[dict[str, int], ...]:
    out, start = [], 0
    layers = model.layer_blocks()
    for n in stage_layers:
        counts: dict[str, int] = {}
        for blocks in layers[start : start + n]:
            for kind in blocks:
                counts[kind] = counts.get(kind, 0) + 1
        out.append(counts)
        start += n
    return tuple(out)


@functools.lru_cache(maxsize=256)
def _layered_invocations(model: ModelSpec) -> tuple[tuple[str, int], ...]:
    """A mixture of experts' or a mixed model's block invocations, counted over its layers once."""
    counts: dict[str, int] = {}
    for blocks in model.layer_blocks():
        for kind in blocks:
            counts[kind] = counts.get(kind, 0) + 1
    if model.family == "mixed":  # in the order the layers first run them
        return tuple(counts.items())
    order = ("attention", "mlp", "router", "experts", "shared_expert")
    return tuple((kind, counts[kind]) for kind in order if counts.get(kind))


def first_layers(model: ModelSpec, layers: int, field_name: str = "--layers") -> ModelSpec:
    """The model cut to its first `layers` layers (`meshplan execute --layers`), named "<model>/<k>L".
    What is counted over the layers keeps its share of them: a hybrid's shared-block invocations and
    the sliding-window layers (at least one of each where the model has any), and the shared-block
    copies those invocations run. More layers than the
    model has is an error naming `field_name`."""
    if not isinstance(layers, int) or not 1 <= layers <= model.layers:
        raise MeshplanError(
            f"{field_name}: {model.name} has {model.layers} layers; give 1 to {model.layers} (0 runs all of them)"
        )
    if layers == model.layers:
        return model

    def share(count: int, most: int) -> int:
        return min(most, max(1, round(count * layers / model.layers))) if count else 0

    hybrid = share(model.hybrid_layers, layers)
    kept = model.layer_blocks()[:layers]
    attention = sum("attention" in blocks for blocks in kept) if model.family != "hybrid" else hybrid
    return replace(
        model,
        name=f"{model.name}/{layers}L",
        layers=layers,
        hybrid_layers=hybrid,
        hybrid_layer_ids=(),  # the cut's shared-block layers spread evenly, in the model's proportion
        # The copies of the shared block those layers invoke (invocation k runs copy k mod copies): the cut
        # holds no copy it never runs (6 of Zamba2-7B's 81 layers invoke one of its two: predicted with
        # both, the 6-layer run's peak was 4.7 GiB under, session 21)
        shared_blocks=min(model.shared_blocks, hybrid) if hybrid else model.shared_blocks,
        window_layers=share(model.window_layers, attention),
        dense_layer_ids=tuple(i for i in model.dense_layer_ids if i < layers),
        layer_kinds=kept if model.family == "mixed" else (),
        mtp_layers=0,  # the MTP modules are the last layers
    )


# -- presets ----------------------------------------------------------------------------------


def dense(
    name: str,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    ffn_hidden: int,
    vocab: int,
    *,
    gated: bool = True,
    tied: bool = False,
    source: str = "",
    head_dim: int | None = None,
    bias: bool = False,
    norm: str = "rmsnorm",
    positions: str = "rotary",
    max_positions: int = 0,
) -> ModelSpec:
    """A pre-norm decoder stack; the heads split `hidden` evenly unless `head_dim` is given."""
    if head_dim is None:
        head_dim = hidden // heads
        if head_dim * heads != hidden:
            raise MeshplanError(f"model {name}: heads ({heads}) must divide hidden ({hidden}); or give head_dim")
    return ModelSpec(
        name=name,
        family="dense",
        d_model=hidden,
        layers=layers,
        vocab=vocab,
        tied_embeddings=tied,
        attention=AttentionSpec(hidden, heads, kv_heads, head_dim, hidden, bias=bias),
        mlp=MlpSpec(hidden, ffn_hidden, gated, bias=bias),
        norm=norm,
        positions=positions,
        max_positions=max_positions,
        source=source,
    )


def gpt(
    name: str,
    hidden: int,
    layers: int,
    heads: int,
    vocab: int,
    seq: int,
    *,
    ffn_hidden: int = 0,
    tied: bool = True,
    positions: str = "learned",
    source: str = "",
) -> ModelSpec:
    """The GPT decoder of the Megatron papers (Narayanan et al. 2021 §5; Korthikanti et al. 2022 §3):
    LayerNorm, biases on every projection, a 4h GeLU MLP, learned positions over `seq` tokens and a
    tied output head. Its parameter count is their Eq. 2, 12·l·h² + 13·l·h + (V + s)·h, plus the final
    LayerNorm's 2h."""
    return dense(
        name,
        hidden,
        layers,
        heads,
        heads,
        ffn_hidden or 4 * hidden,
        vocab,
        gated=False,
        tied=tied,
        source=source,
        bias=True,
        norm="layernorm",
        positions=positions,
        max_positions=seq if positions == "learned" else 0,
    )


def mamba2(
    name: str,
    d_model: int,
    layers: int,
    vocab: int,
    *,
    d_state: int = 128,
    headdim: int = 64,
    ngroups: int = 1,
    expand: int = 2,
    d_conv: int = 4,
    tied: bool = True,
    source: str = "",
) -> ModelSpec:
    return ModelSpec(
        name=name,
        family="mamba2",
        d_model=d_model,
        layers=layers,
        vocab=vocab,
        tied_embeddings=tied,
        mamba2=Mamba2Spec(d_model, d_state, expand, headdim, ngroups, d_conv),
        source=source,
    )


def moe(spec: ModelSpec, moe_spec: MoeSpec, *, rope_theta: float = 10000.0, dense_layer_ids=()) -> ModelSpec:
    """A dense preset's MLPs made mixtures of experts (but on `dense_layer_ids`)."""
    return replace(
        spec,
        family="moe",
        moe=moe_spec,
        dense_layer_ids=tuple(dense_layer_ids),
        mlp=spec.mlp if dense_layer_ids else None,
        rope=RopeSpec(theta=rope_theta),
    )


def _qwen3(name: str, hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, *, source: str) -> ModelSpec:
    """Qwen3's decoder: heads of 128, a 128-wide RMS norm each of queries and keys, vocab 151936, untied."""
    spec = dense(name, hidden, layers, heads, kv_heads, ffn, 151936, head_dim=128, source=source)
    return replace(spec, attention=replace(spec.attention, qk_norm=2 * 128))


# deepseek-ai/DeepSeek-V3 config.json: hidden 7168, 61 layers, the first 3 dense (FFN 18432), then 256 routed
# experts of 2048, top 8, and one shared expert of 2048; MLA with 128 heads, q_lora_rank 1536, kv_lora_rank 512,
# qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128; vocab 129280, untied; YaRN rope (factor 40 over
# 4096). 671B parameters, 37B active (DeepSeek-V3 report, Table 1), without its MTP module (transformers
# builds none).
_DEEPSEEK_V3 = ModelSpec(
    name="deepseek-v3",
    family="moe",
    d_model=7168,
    layers=61,
    vocab=129280,
    attention=AttentionSpec(
        7168, 128, 128, 192, 7168, kv_lora_rank=512, q_lora_rank=1536, rope_head_dim=64, v_head_dim=128
    ),
    mlp=MlpSpec(7168, 18432),
    moe=MoeSpec(7168, 256, 8, 2048, shared_ffn=2048),
    dense_layer_ids=(0, 1, 2),
    rope=RopeSpec(theta=10000.0, kind="yarn", factor=40.0, original_max_positions=4096),
    norm_eps=1e-6,
    source="deepseek-ai/DeepSeek-V3 config.json",
)

# state-spaces/mamba2-* config.json: d_state 128, headdim 64, ngroups 1, expand 2, d_conv 4,
# vocab 50277 padded to a multiple of 16 (pad_vocab_size_multiple) = 50288, tied embeddings.
_MAMBA2_VOCAB = 50288
_MAMBA2_SRC = "state-spaces/mamba2-* config.json (d_model, n_layer), mamba_ssm Mamba2 defaults"

PRESETS: dict[str, ModelSpec] = {
    # docs/design.md §6 anchor: the 7B dense model of the TSP paper (arXiv 2604.26294).
    "dense-7b": dense(
        "dense-7b",
        4096,
        32,
        32,
        32,
        4 * 4096,
        32000,
        source="docs/design.md §6 (TSP paper 7B: h 4096, 32 layers, 32 heads, F 4 gated, V 32000)",
    ),
    # meta-llama/Meta-Llama-3-8B config.json.
    "llama3-8b": replace(
        dense("llama3-8b", 4096, 32, 32, 8, 14336, 128256, source="meta-llama/Meta-Llama-3-8B config.json"),
        rope=RopeSpec(theta=500000.0),
    ),
    "mamba2-130m": mamba2("mamba2-130m", 768, 24, _MAMBA2_VOCAB, source=_MAMBA2_SRC),
    "mamba2-370m": mamba2("mamba2-370m", 1024, 48, _MAMBA2_VOCAB, source=_MAMBA2_SRC),
    "mamba2-780m": mamba2("mamba2-780m", 1536, 48, _MAMBA2_VOCAB, source=_MAMBA2_SRC),
    "mamba2-1.3b": mamba2("mamba2-1.3b", 2048, 48, _MAMBA2_VOCAB, source=_MAMBA2_SRC),
    "mamba2-2.7b": mamba2("mamba2-2.7b", 2560, 64, _MAMBA2_VOCAB, source=_MAMBA2_SRC),
    # tiiuae/falcon-mamba-7b config.json: hidden 4096, 64 layers, state 16, expand 2 (intermediate
    # 8192), conv 4, time_step_rank 256, vocab 65024, untied (7.27B parameters).
    "falcon-mamba-7b": ModelSpec(
        name="falcon-mamba-7b",
        family="mamba1",
        d_model=4096,
        layers=64,
        vocab=65024,
        tied_embeddings=False,
        mamba1=Mamba1Spec(4096, d_state=16, expand=2, dt_rank=256, d_conv=4),
        source="tiiuae/falcon-mamba-7b config.json",
    ),
    # Zyphra/Zamba2-7B config.json: hidden 3584, 81 Mamba-2 layers (d_state 64, headdim 64,
    # ngroups 2, expand 2), 2 shared transformer blocks used ABAB in 13 hybrid layers; the shared
    # block's attention reads concat(hidden, embedding) = 7168 wide (32 heads of 224) and writes 3584,
    # its MLP is 3584 → 14336 → 3584 (transformers' modeling_zamba2.py); each hybrid layer owns a
    # 3584 × 3584 linear and a rank-128 LoRA adapter on the shared MLP's gate/up (the attention has
    # none: use_shared_attention_adapter false); vocab 32000, tied. 7,356,749,648 parameters, what
    # transformers builds from that config (the Zamba2 report's "7.4B").
    "zamba2-7b": ModelSpec(
        name="zamba2-7b",
        family="hybrid",
        d_model=3584,
        layers=81,
        vocab=32000,
        tied_embeddings=True,
        mamba2=Mamba2Spec(3584, d_state=64, expand=2, headdim=64, ngroups=2, d_conv=4),
        attention=AttentionSpec(7168, 32, 32, 224, 3584),
        mlp=MlpSpec(3584, 14336, gated=True),
        hybrid_layers=13,
        shared_blocks=2,
        adapter_rank=128,
        source="Zyphra/Zamba2-7B config.json",
    ),
    # mistralai/Mixtral-8x7B-v0.1 config.json: hidden 4096, 32 layers, 32 heads, 8 KV heads, every MLP 8
    # experts of 14336, top 2, vocab 32000, untied, rope_theta 1e6 (46.7B parameters, 12.9B active: its model card).
    "mixtral-8x7b": moe(
        dense("mixtral-8x7b", 4096, 32, 32, 8, 14336, 32000, source="mistralai/Mixtral-8x7B-v0.1 config.json"),
        MoeSpec(4096, 8, 2, 14336),
        rope_theta=1e6,
    ),
    # Qwen/Qwen3-30B-A3B config.json: hidden 2048, 48 layers, 32 heads of 128, 4 KV heads, query/key norms,
    # every MLP 128 experts of 768, top 8, vocab 151936, untied, rope_theta 1e6 (30.5B, 3.3B active: model card).
    "qwen3-30b-a3b": moe(
        _qwen3("qwen3-30b-a3b", 2048, 48, 32, 4, 6144, source="Qwen/Qwen3-30B-A3B config.json"),
        MoeSpec(2048, 128, 8, 768),
        rope_theta=1e6,
    ),
    # Qwen/Qwen3-235B-A22B config.json: hidden 4096, 94 layers, 64 heads of 128, 4 KV heads, every MLP 128
    # experts of 1536, top 8, vocab 151936, untied, rope_theta 1e6 (235B, 22B active: model card).
    "qwen3-235b-a22b": moe(
        _qwen3("qwen3-235b-a22b", 4096, 94, 64, 4, 12288, source="Qwen/Qwen3-235B-A22B config.json"),
        MoeSpec(4096, 128, 8, 1536),
        rope_theta=1e6,
    ),
    "deepseek-v3": _DEEPSEEK_V3,
    # DeepSeek-V3 with its one multi-token-prediction module, as it was trained (DeepSeek-V3 report §2.2;
    # num_nextn_predict_layers 1): 62 layers, the last the MTP module's. Its embedding and output head are
    # the model's (the checkpoint's 685B stores copies of both: 671B + 11.6B + 2 · 0.93B).
    "deepseek-v3-mtp": replace(_DEEPSEEK_V3, name="deepseek-v3-mtp", layers=62, mtp_layers=1),
    # nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 config.json: hidden 2688, 52 layers by its
    # hybrid_override_pattern (23 Mamba-2, 23 MoE, 6 attention); Mamba-2 64 heads of 64 (4096 wide), 8 groups,
    # state 128, conv 4; attention 32 heads of 128, 2 KV heads, no rotary positions; 128 squared-ReLU experts of
    # 1856, top 6, a shared expert of 3712; vocab 131072, untied (31.6B parameters, 3.6B active with the
    # embeddings: the Nemotron 3 Nano report, arXiv 2512.20848).
    "nemotron-3-nano": ModelSpec(
        name="nemotron-3-nano",
        family="mixed",
        d_model=2688,
        layers=52,
        vocab=131072,
        mamba2=Mamba2Spec(
            2688, d_state=128, expand=2, headdim=64, ngroups=8, d_conv=4, chunk_size=128, d_inner_width=4096
        ),
        attention=AttentionSpec(2688, 32, 2, 128, 2688),
        moe=MoeSpec(2688, 128, 6, 1856, gated=False, shared_ffn=3712, score="sigmoid"),
        rope=RopeSpec(kind="none"),
        layer_kinds=tuple(NEMOTRON_H_KINDS[c] for c in "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"),
        source="nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 config.json",
    ),
}

"""Every assumption the cost model makes, as an option with a default; printed with each result."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

from meshplan.costmodel.stacks import CP_COMM_TYPES, FP8_RECIPES, PRECISIONS, get_stack, stack_at
from meshplan.errors import MeshplanError
from meshplan.models import DTYPE_BYTES, frozen_hash

MODES = ("train", "prefill", "decode")
SCHEDULES = ("1f1b", "interleaved")
RECOMPUTE = ("none", "selective", "full")
# Megatron-Core's --recompute-modules under --recompute-granularity selective (transformer_config.py;
# default ["core_attn"]): core_attn, the attention core (Korthikanti et al. 2022's selective recompute);
# moe, the whole MoE layer after its norm — router, token dispatch and combine, routed and shared
# experts (MoELayer.forward under checkpoint, its all-to-alls redone); layernorm, the norms Transformer
# Engine does not fuse into a linear (the MoE layer's pre-norm: TENorm, its output discarded and rebuilt
# by CheckpointWithoutOutput; MLA's separate input norm, which Megatron recomputes too, is not priced);
# moe_act, the routed experts' activation (fc1's output kept, fc2's input
# rebuilt); shared_experts, the shared experts alone; mlp, the dense MLP with its fused norm.
RECOMPUTE_MODULES = ("core_attn", "moe", "layernorm", "moe_act", "shared_experts", "mlp")
OPTIMIZERS = ("adam", "none")
MOE_DISPATCHERS = ("alltoall", "allgather", "deepep")
# An FP8 tensor's bytes an element: the e4m3/e5m2 byte, and under MXFP8 an E8M0 scale a 32-element
# block (OCP Microscaling Formats (MX) v1.0, §5: block size 32, 8-bit shared exponent)
FP8_ELEMENT_BYTES = {"fp8": 1.0, "mxfp8": 1.0 + 1 / 32}


@dataclass(frozen=True)
class CostOptions:
    mode: str = "train"
    recompute: str = "none"  # Korthikanti et al. 2022: none, selective (attention core), full (layer inputs)
    recompute_modules: tuple[str, ...] = ("core_attn",)  # what selective recompute redoes (RECOMPUTE_MODULES)
    flash_attention: bool = True  # no s² score matrix is stored (FlashAttention / SDPA's fused kernels)
    dropout: bool = False  # 1-byte masks after attention, MLP and in the scores (Korthikanti's 34·sbh has them)
    act_dtype: str = "bf16"
    grad_dtype: str = "bf16"  # 2 B/param (16 B/param in all with Adam) or fp32: 4 B/param (18 B/param)
    optimizer: str = "adam"  # mixed-precision Adam: fp32 master + m + v = 12 B/param (ZeRO paper, §3)
    logits_dtype: str = "fp32"  # the loss computed in fp32
    kv_cache_dtype: str = "bf16"
    ssm_state_dtype: str = "fp32"  # docs/design.md §3: the SSM state cache kept in fp32
    tp_sequence_parallel: bool = False  # Megatron-SP on the TP axis: full-width activations also split by T
    int8_allreduce: bool = False  # TP-SSM: the block's all-reduce in int8 with per-group fp32 scales
    microbatches: int = 0  # pipeline micro-batches per step; 0: 4·pp (GPipe, Huang et al. 2019 §2.3: M ≥ 4K)
    # Floor every step at the eager executor's kernel launches (measured kernels per block, each at the
    # measured host cost: meshplan.costmodel.compute.STEP_KERNEL_HOST_S, DECODE_KERNEL_HOST_S); off for
    # stacks that launch far fewer (CUDA graphs).
    launch_floor: bool = True
    # SP deals its tokens in zigzag where it can (meshplan.layout.sp_zigzag: every rank the same causal
    # work, as this executor does since run 36); False: contiguous shards, where every rank waits for
    # the last one's attention.
    sp_zigzag: bool = True
    # Context parallelism's K/V exchange (meshplan.costmodel.stacks.Stack.cp_comm_type: allgather, p2p,
    # a2a); "": as the stack does
    cp_comm_type: str = ""
    # Sequences per optimizer step over the whole cluster; 0: one micro-batch per replica (or
    # `microbatches` of them). Fixed, it makes DP change the accumulation steps, not the tokens.
    global_batch: int = 0
    schedule: str = "1f1b"  # pipeline schedule: 1f1b (Narayanan et al. 2021 §2.2.1) or interleaved (§2.2.2)
    virtual_stages: int = 1  # model chunks a pipeline rank holds under the interleaved schedule
    stage_layers: tuple[int, ...] = ()  # layers of each pipeline stage; (): as even as they go (pipeline_stages)
    # Megatron-Core's production pipeline layouts (meshplan.costmodel.pipeline.stage_layout; Megatron-LM
    # d98e8a6): --pipeline-model-parallel-layout's string (E, t, m, L, | between virtual stages); the
    # first and last stages' decoder layers (--decoder-first/last-pipeline-num-layers; 0: not given); the
    # embedding and the loss each counted as a layer (--account-for-embedding/loss-in-pipeline-split)
    pipeline_layout: str = ""
    first_stage_layers: int = 0
    last_stage_layers: int = 0
    account_for_embedding: bool = False
    account_for_loss: bool = False
    stack: str = "meshplan"  # whose kernels and overlap rules (meshplan.costmodel.stacks); the CLI defaults to megatron
    pp_scatter_gather: bool | None = None  # None: as the stack does
    # Mixtures of experts (meshplan.costmodel.axes.ep): how tokens reach their experts — Megatron-Core's
    # token dispatchers alltoall and allgather, or DeepEP's (its "flex" dispatcher: node-limited routing,
    # a token crosses to a node once)
    moe_dispatcher: str = "alltoall"
    # Token drop: an expert takes at most capacity_factor × its even share of the routed copies; 0:
    # dropless (Megatron's default)
    capacity_factor: float = 0.0
    moe_pad_to_capacity: bool = False  # token drop padded: every expert runs its full capacity
    # Dropless routing: the busiest expert rank's routed copies over the even share (1: balanced, as
    # under --moe-router-force-load-balancing); it sets the experts' pace and the all-to-all's
    moe_imbalance: float = 1.0
    # DeepEP with node-limited routing (DeepSeek-V3's: a token's experts on at most 4 nodes)
    deepep_node_limit: bool = False
    # Megatron-Core's 1F1B all-to-all overlap (--overlap-moe-expert-parallel-comm, core 0.14): one
    # micro-batch's expert all-to-alls run beside another's compute
    moe_a2a_overlap: bool = False
    # The linear layers' GEMMs (QKV, output projection, MLP, experts, Mamba's in/out projections) in bf16,
    # or in FP8 as Transformer Engine runs them under Megatron-Core --fp8-format hybrid: per-tensor
    # scales (fp8; delayed or current scaling) or MXFP8's 32-element blocks (Blackwell). The attention
    # core, the router, the embedding and the output head stay bf16 (meshplan.costmodel.stacks).
    precision: str = "bf16"
    # Megatron-Core --fp8-param-gather: the FP8 GEMMs' weights kept in FP8 (TE's fp8_model_init), so the
    # distributed optimizer's (and ZeRO-3's) parameter all-gather moves 1 byte a weight, not 2
    fp8_param_gather: bool = False
    # Per-tensor FP8 scaling (--fp8-recipe): delayed (TE's default) or current (an amax pass a tensor)
    fp8_recipe: str = "delayed"

    __hash__ = frozen_hash

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise MeshplanError(f"--mode: unknown {self.mode!r}; use one of {', '.join(MODES)}")
        if self.recompute not in RECOMPUTE:
            raise MeshplanError(f"--recompute: unknown {self.recompute!r}; use one of {', '.join(RECOMPUTE)}")
        unknown = [m for m in self.recompute_modules if m not in RECOMPUTE_MODULES]
        if unknown or not self.recompute_modules:
            raise MeshplanError(
                f"--recompute-modules: unknown {unknown[0] if unknown else 'empty list'!r}; give some of "
                f"{', '.join(RECOMPUTE_MODULES)} (Megatron-Core's names)"
            )
        if self.recompute_modules != ("core_attn",) and self.recompute != "selective":
            raise MeshplanError(
                f"--recompute-modules {','.join(self.recompute_modules)} is selective recompute's list: add "
                "--recompute selective"
            )
        if self.optimizer not in OPTIMIZERS:
            raise MeshplanError(f"--optimizer: unknown {self.optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
        if self.microbatches < 0:
            raise MeshplanError(f"--microbatches must be >= 0, got {self.microbatches}")
        if self.global_batch < 0:
            raise MeshplanError(f"--global-batch must be >= 0, got {self.global_batch}")
        if self.schedule not in SCHEDULES:
            raise MeshplanError(f"--schedule: unknown {self.schedule!r}; use one of {', '.join(SCHEDULES)}")
        if self.virtual_stages < 1:
            raise MeshplanError(f"--virtual-stages must be >= 1, got {self.virtual_stages}")
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise MeshplanError("--virtual-stages > 1 needs --schedule interleaved")
        self._check_pipeline_layout()
        stack = get_stack(self.stack)
        if self.precision not in PRECISIONS:
            raise MeshplanError(f"--precision: unknown {self.precision!r}; use one of {', '.join(PRECISIONS)}")
        if self.precision != "bf16" and not stack.fp8:
            raise MeshplanError(
                f"--precision {self.precision}: --stack {self.stack} runs its GEMMs in bf16 only (no Transformer "
                "Engine FP8); use --stack megatron or --precision bf16"
            )
        if self.fp8_param_gather and self.precision != "fp8":
            raise MeshplanError(
                "--fp8-param-gather keeps per-tensor-scaled FP8 weights: it needs --precision fp8"
                + (" (MXFP8 weights are not priced)" if self.precision == "mxfp8" else "")
            )
        if self.fp8_recipe not in FP8_RECIPES:
            raise MeshplanError(f"--fp8-recipe: unknown {self.fp8_recipe!r}; use one of {', '.join(FP8_RECIPES)}")
        if self.fp8_recipe != "delayed" and self.precision != "fp8":
            raise MeshplanError(f"--fp8-recipe {self.fp8_recipe} scales per-tensor FP8: it needs --precision fp8")
        if self.cp_comm_type and self.cp_comm_type not in CP_COMM_TYPES:
            raise MeshplanError(
                f"--cp-comm-type: unknown {self.cp_comm_type!r}; use one of {', '.join(CP_COMM_TYPES)} "
                "(Megatron's hierarchical a2a+p2p is not priced)"
            )
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise MeshplanError(
                f"--moe-dispatcher: unknown {self.moe_dispatcher!r}; use one of {', '.join(MOE_DISPATCHERS)}"
            )
        if self.capacity_factor < 0 or (self.capacity_factor and self.capacity_factor < 1 / 64):
            raise MeshplanError(
                f"--capacity-factor must be 0 (dropless) or a positive factor such as 1.0, got {self.capacity_factor}"
            )
        if self.moe_pad_to_capacity and not self.capacity_factor:
            raise MeshplanError("--moe-pad-to-capacity needs --capacity-factor (padding is to a capacity)")
        if self.moe_pad_to_capacity and self.moe_dispatcher == "deepep":
            raise MeshplanError(
                "--moe-pad-to-capacity: DeepEP pads no capacity (Megatron-Core refuses it); "
                "use --moe-dispatcher alltoall"
            )
        if self.deepep_node_limit and self.moe_dispatcher != "deepep":
            raise MeshplanError("--deepep-node-limit routes DeepEP's way; add --moe-dispatcher deepep")
        if self.moe_imbalance < 1:
            raise MeshplanError(
                f"--moe-imbalance is the busiest expert rank's load over the even share: >= 1, got {self.moe_imbalance}"
            )
        for name in ("act_dtype", "grad_dtype", "logits_dtype", "kv_cache_dtype", "ssm_state_dtype"):
            if getattr(self, name) not in DTYPE_BYTES:
                raise MeshplanError(
                    f"--{name.replace('_', '-')}: unknown dtype {getattr(self, name)!r}; "
                    f"use one of {', '.join(DTYPE_BYTES)}"
                )

    def _check_pipeline_layout(self) -> None:
        """The layout options one at a time, as Megatron-Core's arguments.py and transformer_block.py
        allow them: a layout string alone; first/last stage layers without the account-for split."""
        from meshplan.costmodel.pipeline import parse_pipeline_layout

        if self.first_stage_layers < 0 or self.last_stage_layers < 0:
            raise MeshplanError("--first-stage-layers / --last-stage-layers must be >= 1 (0: not given)")
        uneven = bool(self.first_stage_layers or self.last_stage_layers)
        account = self.account_for_embedding or self.account_for_loss
        if self.stage_layers and (self.pipeline_layout or uneven or account):
            raise MeshplanError(
                "--stage-layers gives every stage's layers: drop --pipeline-layout, --first/--last-stage-layers "
                "and --account-for-embedding/--account-for-loss"
            )
        if self.pipeline_layout:
            if uneven or account:
                raise MeshplanError(
                    "--pipeline-layout places every layer, the embedding and the loss itself: drop "
                    "--first/--last-stage-layers and --account-for-embedding/--account-for-loss"
                )
            parse_pipeline_layout(self.pipeline_layout)
        if uneven and account:
            raise MeshplanError(
                "--first/--last-stage-layers with --account-for-embedding/--account-for-loss: Megatron-Core "
                "refuses the pair (transformer_block.py: get_num_layers_to_build); use one, or --pipeline-layout"
            )

    @property
    def training(self) -> bool:
        return self.mode == "train"

    def recomputes(self, module: str) -> bool:
        """Backward redoes `module`'s forward (a Megatron recompute module, RECOMPUTE_MODULES): every
        module under full recompute, the listed ones under selective."""
        if self.recompute == "full":
            return True
        return self.recompute == "selective" and module in self.recompute_modules

    def microbatches_for(self, pp: int) -> int:
        """Micro-batches a step when no global batch is fixed: `microbatches`, else 4·pp under a pipeline."""
        if self.microbatches:
            return self.microbatches
        return 1 if pp == 1 else 4 * pp

    def steps_for(self, dp: int, pp: int, micro_batch: int) -> int:
        """Micro-batches each replica runs a step: GBS / (DP · MBS) with a global batch fixed
        (validate_batch checks it divides), else microbatches_for(pp)."""
        if self.global_batch:
            return max(1, self.global_batch // (dp * micro_batch))
        return self.microbatches_for(pp)

    @property
    def expert_load(self) -> float:
        """The busiest expert rank's routed copies over the even share: the capacity when padded to it,
        the imbalance capped by the capacity under token drop, the imbalance when dropless."""
        if self.moe_pad_to_capacity:
            return self.capacity_factor
        if self.capacity_factor:
            return min(self.moe_imbalance, self.capacity_factor)
        return self.moe_imbalance

    @property
    def stack_spec(self):
        """The stack as this run runs it: at its GEMM precision (meshplan.costmodel.stacks.stack_at)."""
        return stack_at(self.stack, self.precision, self.fp8_param_gather, self.fp8_recipe)

    @property
    def cp_comm(self) -> str:
        """Context parallelism's K/V exchange as this run makes it: the option's, else the stack's."""
        return self.cp_comm_type or get_stack(self.stack).cp_comm_type

    @property
    def gemm_input_bytes(self) -> float:
        """Bytes an element of a saved FP8-GEMM input takes: the activation dtype's under bf16; one byte
        in FP8 (Transformer Engine's Linear saves its quantized input for the weight gradient); MXFP8
        adds an E8M0 scale byte a 32-element block (OCP MX v1.0 spec §5)."""
        return self.nbytes("act_dtype") if self.precision == "bf16" else FP8_ELEMENT_BYTES[self.precision]

    @property
    def floors_launches(self) -> bool:
        """The eager launch floor applies: the stack launches eagerly, and it was not turned off."""
        return self.launch_floor and self.stack_spec.launch_floor

    @property
    def scatter_gather(self) -> bool:
        return self.stack_spec.pp_scatter_gather if self.pp_scatter_gather is None else self.pp_scatter_gather

    @property
    def chunks(self) -> int:
        """Model chunks a pipeline rank holds: the virtual stages under the interleaved schedule."""
        return self.virtual_stages if self.schedule == "interleaved" else 1

    def nbytes(self, name: str) -> int:
        return DTYPE_BYTES[getattr(self, name)]

    def as_dict(self) -> dict:
        return dict(_fields(self))


@functools.lru_cache(maxsize=64)
def _fields(opts: CostOptions) -> dict:
    """The options as a dict, once per options object (every mesh's memory report carries them: the
    planner asks for it a thousand times a ranking)."""
    return asdict(opts)


MemoryOptions = CostOptions  # the memory model reads a subset of the same options

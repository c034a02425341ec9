"""Every assumption the cost model makes, as an option with a default; printed with each result."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

from meshplan.errors import MeshplanError
from meshplan.models import DTYPE_BYTES

MODES = ("train", "prefill", "decode")
RECOMPUTE = ("none", "selective", "full")
OPTIMIZERS = ("adam", "none")


@dataclass(frozen=True)
class CostOptions:
    mode: str = "train"
    recompute: str = "none"  # Korthikanti et al. 2022: none, selective (attention core), full (layer inputs)
    flash_attention: bool = True  # no s² score matrix is stored (FlashAttention / SDPA's fused kernels)
    dropout: bool = False  # 1-byte masks after attention, MLP and in the scores (Korthikanti's 34·sbh has them)
    act_dtype: str = "bf16"
    grad_dtype: str = "bf16"  # 2 B/param (16 B/param in all with Adam) or fp32: 4 B/param (18 B/param)
    optimizer: str = "adam"  # mixed-precision Adam: fp32 master + m + v = 12 B/param (ZeRO paper, §3)
    logits_dtype: str = "fp32"  # the loss computed in fp32
    kv_cache_dtype: str = "bf16"
    ssm_state_dtype: str = "fp32"  # DESIGN.md §3: the SSM state cache kept in fp32
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

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise MeshplanError(f"--mode: unknown {self.mode!r}; use one of {', '.join(MODES)}")
        if self.recompute not in RECOMPUTE:
            raise MeshplanError(f"--recompute: unknown {self.recompute!r}; use one of {', '.join(RECOMPUTE)}")
        if self.optimizer not in OPTIMIZERS:
            raise MeshplanError(f"--optimizer: unknown {self.optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
        if self.microbatches < 0:
            raise MeshplanError(f"--microbatches must be >= 0, got {self.microbatches}")
        for name in ("act_dtype", "grad_dtype", "logits_dtype", "kv_cache_dtype", "ssm_state_dtype"):
            if getattr(self, name) not in DTYPE_BYTES:
                raise MeshplanError(f"--{name.replace('_', '-')}: unknown dtype {getattr(self, name)!r}; "
                                    f"use one of {', '.join(DTYPE_BYTES)}")

    @property
    def training(self) -> bool:
        return self.mode == "train"

    def microbatches_for(self, pp: int) -> int:
        if pp == 1:
            return 1
        return self.microbatches or 4 * pp

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

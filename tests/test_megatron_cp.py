"""Megatron's context parallelism as the megatron stack prices it (issue #31's long-context rows): its
distributed optimizer shards over dp × cp, and Transformer Engine's context-parallel attention keeps
each step's output rather than recomputing the core in backward — meshplan's executor does neither."""

import pytest

from meshplan.costmodel.memory import memory_per_gpu
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.step import estimate_step
from meshplan.layout import parse_layout
from meshplan.models import PRESETS
from meshplan.topologies import load_cluster

MODEL = PRESETS["llama3-8b"]


def test_the_distributed_optimizer_shards_over_dp_times_cp():
    """cp (sp) = 8 on one node, dp = 1, ZeRO-1: Megatron keeps 1/8 of the optimizer states a rank;
    meshplan's executor, which shards over dp only, keeps them all."""
    layout = parse_layout("sp=8,zero=1")
    megatron = CostOptions(stack="megatron")
    states = memory_per_gpu(MODEL, layout, 32768, 1, megatron).per_gpu_bytes["optimizer_state"]
    whole = memory_per_gpu(MODEL, parse_layout("sp=8"), 32768, 1, megatron).per_gpu_bytes["optimizer_state"]
    assert states == pytest.approx(whole / 8, rel=1e-6)
    own = memory_per_gpu(MODEL, layout, 32768, 1, CostOptions(stack="meshplan")).per_gpu_bytes["optimizer_state"]
    assert own == whole


def test_context_parallel_attention_is_not_recomputed_under_megatron():
    """The same sp = 8 step: the megatron stack's attention has no recompute part, meshplan's redoes
    the core (its sequence shards keep only the local q, k, v)."""
    cluster = load_cluster("h100-sxm-8")
    for stack, redone in (("megatron", False), ("meshplan", True)):
        est = estimate_step(MODEL, parse_layout("sp=8"), 32768, 1, CostOptions(stack=stack), cluster)
        assert (est.breakdown["recompute_s"] > 0) is redone, stack

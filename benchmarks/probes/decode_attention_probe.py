"""Decode peak with the executor's causal_attention as is, and with plain SDPA in its place."""

import runpy
import sys

import torch.nn.functional as F

if sys.argv[1] == "plain":
    import meshplan.executor.blocks as blocks
    import meshplan.executor.layouts.dense as dense

    def plain(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])

    blocks.causal_attention = plain
    dense.causal_attention = plain
sys.argv = ["gpu_validation.py", *sys.argv[2:]]
runpy.run_path("benchmarks/gpu_validation.py", run_name="__main__")

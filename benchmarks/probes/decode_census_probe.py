"""Which CUDA tensors are alive after the decode prefill of gpu_validation's dense single run, and
how much memory is allocated then and at the decode steps' peak (issue #34: a decode peak 1 GiB above
run 60's, bisected to commit bf7185d, the whole model in the executor)."""

import gc
import runpy
import sys

import torch

import meshplan.executor.run as run

_prefill = run._prefill


def census(tag):
    torch.cuda.synchronize()
    big = {}
    for obj in gc.get_objects():
        try:
            if torch.is_tensor(obj) and obj.is_cuda and obj.numel() * obj.element_size() >= 32 * 2**20:
                key = (tuple(obj.shape), str(obj.dtype), obj.untyped_storage().data_ptr())
                big[key] = obj.untyped_storage().nbytes()
        except Exception:
            pass
    total = sum(big.values())
    held = torch.cuda.memory_allocated() / 2**30
    print(f"[{tag}] allocated {held:.3f} GiB; tensors >= 32 MiB: {total / 2**30:.3f} GiB")
    for (shape, dtype, _), nbytes in sorted(big.items(), key=lambda kv: -kv[1])[:20]:
        print(f"    {nbytes / 2**20:9.1f} MiB {dtype} {shape}")


def traced(*args, **kwargs):
    census("before prefill")
    out = _prefill(*args, **kwargs)
    gc.collect()
    census("after prefill")
    return out


run._prefill = traced
sys.argv = ["gpu_validation.py", *sys.argv[1:]]
runpy.run_path("benchmarks/gpu_validation.py", run_name="__main__")

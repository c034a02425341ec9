"""Launch a Triton kernel through its compiled form, skipping the JIT's per-call work.

`kernel[grid](...)` binds every argument, derives the specialization key and looks the compiled kernel
up on each call. On the H200 hosts with Triton 3.6 a 4-argument launch costs the host 12.2 us that way
and 7.7 us through the compiled kernel's runner (launch_jit_us, launch_bound_us in
benchmarks/results/peer-probe-h200x2.json), beside a GPU time of 8.6 us for a 16 MiB quantize: on a
path of two short kernels the host sets the pace.

`bind` compiles for one specialization without launching and returns a launcher of the same
arguments. The caller keeps it for arguments specialized alike (the same dtypes, 16-byte alignment and
integer values; an integer that changes every call, a counter, must be in the kernel's
do_not_specialize). Under TRITON_INTERPRET there is nothing compiled and every launch goes through the
JIT (the interpreter).

Only the peer all-reduce's two kernels launch this way. Launches keyed per call on those properties,
for every Triton kernel in a Mamba-2 training step (mamba2-2.7b/2L, 4K and 16K tokens, one H200), left
the host's time a step where the JIT's launches put it (4K: 7.1-8.3 ms keyed against 7.2-8.4 through
the JIT; 16K: 8.3-10.1 against 8.4-9.4; three interleaved rounds,
benchmarks/results/fastlaunch-ab-h200.json): Triton 3.6 binds arguments in native code, and a Python
key over a kernel's 20-odd arguments costs about what it saves.
"""

from __future__ import annotations

import os
from typing import Callable


def bind(kernel, grid: tuple[int, ...], *args, **meta) -> Callable:
    """Compile `kernel` (not launch it) for arguments specialized as `args` are; returns a function that
    launches it on `grid` with arguments of that specialization, passed as `args` were (`meta` bound)."""
    warmup = getattr(kernel, "warmup", None)
    compiled = None
    if warmup is not None and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        compiled = warmup(*args, grid=grid, **meta)
    if compiled is None or not hasattr(compiled, "__getitem__"):
        return lambda *a: kernel[grid](*a, **meta)
    runner = compiled[tuple(grid) + (1,) * (3 - len(grid))]
    # The runner takes every argument in declaration order, compile-time ones included (their defaults
    # where not given).
    defaults = {p.name: p.default for p in getattr(kernel, "params", ())}
    tail = tuple(meta[name] if name in meta else defaults[name] for name in list(kernel.arg_names)[len(args) :])
    return lambda *a: runner(*a, *tail)

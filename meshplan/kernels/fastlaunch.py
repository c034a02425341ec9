"""Launch a Triton kernel through its compiled form, skipping the JIT's per-call work.

`kernel[grid](...)` binds every argument, derives the specialization key and looks the compiled kernel
up on each call. On the H200 hosts with Triton 3.6 a 4-argument launch costs the host 12.2 us that way
and 7.7 us through the compiled kernel's runner (launch_jit_us, launch_bound_us in
benchmarks/results/peer-probe-h200x2.json), beside a GPU time of 8.6 us for a 16 MiB quantize: on a
path of two short kernels the host sets the pace.

`bind` compiles for one specialization without launching and returns a launcher of the same
arguments; `FastLaunch(...)(grid, ...)` keeps one such launcher per specialization key (each tensor's
dtype, device and 16-byte alignment, each integer's value, the grid and the compile-time arguments).
An integer that changes every call (a counter) is named in `unkeyed` and must be in the kernel's
do_not_specialize. Under TRITON_INTERPRET there is nothing compiled and every launch goes through the
JIT (the interpreter).

Only the peer all-reduce's two kernels launch this way. Keyed launches of every Triton kernel in a
Mamba-2 training step (mamba2-2.7b/2L, 4K and 16K tokens, one H200) left the host's time a step where
the JIT's launches put it (4K: 7.1-8.3 ms keyed against 7.2-8.4 through the JIT; 16K: 8.3-10.1
against 8.4-9.4; three interleaved rounds, benchmarks/results/fastlaunch-ab-h200.json): Triton 3.6 binds arguments in native
code, and a Python key over a kernel's 20-odd arguments costs about what it saves.
"""

from __future__ import annotations

import os
from typing import Callable

import torch

def _spec(arg):
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.get_device(), arg.data_ptr() % 16 == 0
    return arg


class FastLaunch:
    """kernel[grid](*args, **meta) with the JIT's per-call work done once per specialization."""

    def __init__(self, kernel, unkeyed: tuple[str, ...] = ()):
        self.kernel = kernel
        self.names = list(kernel.arg_names)
        self.unkeyed = {self.names.index(name) for name in unkeyed}
        self.launchers: dict[tuple, Callable] = {}

    def bind(self, grid: tuple[int, ...], *args, **meta) -> Callable:
        """Compile (not launch) for arguments specialized as `args` are; returns a function that launches
        on `grid` with arguments of that specialization, passed as `args` were (`meta` is bound)."""
        warmup = getattr(self.kernel, "warmup", None)
        compiled = None
        if warmup is not None and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            compiled = warmup(*args, grid=grid, **meta)
        if compiled is None or not hasattr(compiled, "__getitem__"):
            kernel = self.kernel
            return lambda *a: kernel[grid](*a, **meta)
        runner = compiled[tuple(grid) + (1,) * (3 - len(grid))]
        # The runner takes every argument in declaration order, compile-time ones included (their
        # defaults where not given).
        defaults = {p.name: p.default for p in getattr(self.kernel, "params", ())}
        tail = tuple(meta[name] if name in meta else defaults[name] for name in self.names[len(args):])
        return lambda *a: runner(*a, *tail)

    def __call__(self, grid: tuple[int, ...], *args, **meta) -> None:
        key = (grid, tuple(None if i in self.unkeyed else _spec(a) for i, a in enumerate(args)), tuple(meta.items()))
        launch = self.launchers.get(key)
        if launch is None:
            launch = self.launchers[key] = self.bind(grid, *args, **meta)
        launch(*args)

"""Bytes the executor's TSP layout moves outside its GEMMs and attention kernels in one whole-model training
forward and backward (embedding, the layers, final norm, LM head, cross-entropy; then the gradient sync of
the norm scales), by source line and aten op: dense-7b at 2 layers in bf16, tsp=2, two gloo ranks on the CPU.

Counted as benchmarks/zigzag_bytes.py counts: every non-view aten op's tensor arguments read and outputs
written (the elements a tensor spans, a broadcast dimension once; in-place ops read and write their first
argument; fills and factories write only; gather, index_select and embedding read the rows they take,
scatter_add_ touches the elements it adds). GEMMs (mm, addmm, bmm, baddbmm, ...) and attention kernels (the
executor's shard Blocks, the whole-chunk SDPA) are not computed: their outputs are allocated (zeros) and
their operands' bytes listed apart, outside the total. Collectives are c10d ops, not counted; the copies
made around them (torch.cat packing, .contiguous()) are aten ops and are.

Each op goes to the innermost meshplan source line on the Python stack; in the backward, an op of a
built-in autograd node goes to the forward line that made the node (anomaly mode's traceback), tagged
<NodeName>; one of a custom Function's backward to the live line in that backward. Autograd's own sums
of two gradients of one tensor (the residual stream's, a weight used twice) run under the node whose
output gradient is being added in (its "add").

The GPU runs some memory-bound work as one Triton kernel where the CPU runs torch's reference ops: the
RMSNorm (meshplan.kernels.gated_norm, the fused one-pass form: forward reads x and writes the output;
backward reads x, dy, writes dx and a per-program fp32 partial of dw, summed after), the rotary (in place:
read and write q or k), SwiGLU (forward reads h, writes h/2; backward reads h and dy, writes dh), the loss
(meshplan.kernels.cross_entropy: the row statistics read the logits, the exponentials read them and write
fp32, the gradient reads those and writes the logits' dtype). By default these count as those kernels'
nominal bytes ("triton:..." and "ce:..." ops), the reference ops run uncounted; `--cpu-paths` counts the
reference ops instead.

    PYTHONPATH=. python benchmarks/tsp_bytes.py [--seq 4096] [--cpu-paths] >> FILE
"""

from __future__ import annotations

import argparse
import inspect
import linecache
import os
import re
import resource
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import replace

import torch
from torch.autograd.function import BackwardCFunction
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

import meshplan

PKG = os.path.dirname(os.path.abspath(meshplan.__file__)) + os.sep
ROOT = os.path.dirname(PKG.rstrip(os.sep)) + os.sep
SPAWN = os.path.join(PKG, "executor", "distributed.py")  # the gloo workers' entry: no source of work
HBM_BYTES_PER_S = 4.8e12  # H200 HBM3e, rated

# Not computed: their operands are listed apart ("stubbed"), outside the total.
GEMMS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "dot", "mv", "addmv", "_addmm_activation", "linear"}
ATTENTION_PREFIXES = ("_scaled_dot_product", "_flash_attention", "_efficient_attention", "_cudnn_attention")
# Move no bytes: views, allocations, metadata.
NO_DATA = {
    "view", "_unsafe_view", "transpose", "slice", "as_strided", "expand", "alias", "t", "permute", "select",
    "unsqueeze", "squeeze", "_reshape_alias", "detach", "empty", "empty_like", "split", "chunk", "unbind",
    "reshape", "lift_fresh", "new_empty", "empty_strided", "new_empty_strided", "is_same_size", "promote_types",
    "transpose_", "unsqueeze_", "squeeze_", "as_strided_", "t_", "detach_", "set_", "resize_", "record_stream",
    "_local_scalar_dense", "unflatten", "view_as", "split_with_sizes", "_has_compatible_shallow_copy_type",
}  # fmt: skip
WRITE_ONLY = {
    "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full",
    "scalar_tensor", "arange", "randn", "rand", "randint", "normal_", "uniform_", "random_",
}  # fmt: skip
GATHERS = {"gather": 2, "index_select": 2, "embedding": 1}  # name: the index argument's place
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _nbytes(t: torch.Tensor) -> int:
    """Bytes of the elements t spans (a broadcast, stride-0 dimension counted once)."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


def _size(x) -> int:
    if isinstance(x, torch.Tensor):
        return _nbytes(x)
    if isinstance(x, (list, tuple)):
        return sum(_size(y) for y in x)
    return 0


def _moved(name: str, args, kwargs, out) -> int:
    """Bytes an op reads and writes."""
    if name in WRITE_ONLY:
        return _size(out)
    if name in ("fill_", "zero_"):
        return _size(args[0])
    if name == "copy_":
        return _size(args[0]) + _size(args[1])
    if name in GATHERS:  # reads the index and the elements it takes, writes them
        return _size(args[GATHERS[name]]) + 2 * _size(out)
    if name == "scatter_add_":  # (self, dim, index, src): the touched elements of self read and written
        src = args[3]
        return _size(args[2]) + _size(src) + 2 * src.numel() * args[0].element_size()
    rest = {k: v for k, v in kwargs.items() if k != "out"}
    return _size(list(args)) + _size(list(rest.values())) + _size(out)


def _dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill its span without gaps or overlaps (contiguous in some dimension order)."""
    if any(st <= 0 and n > 1 for n, st in zip(t.shape, t.stride())):
        return False
    return 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) == t.numel()


def _memcpy(name: str, args, kwargs) -> bool:
    """Whether a GPU runs the op as cudaMemcpyAsync (the profile's "copy" kernels): a copy_ between tensors
    of one dtype and layout, both dense; a clone of a dense tensor into its own layout."""
    if name == "copy_":
        dst, src = args[0], args[1]
        same = dst.dtype == src.dtype and dst.shape == src.shape and dst.stride() == src.stride()
        return same and _dense(dst)
    if name == "clone":
        if kwargs.get("memory_format") == torch.contiguous_format:
            return args[0].is_contiguous()
        return _dense(args[0])
    return False


def _allocated(func, args, kwargs):
    """func's outputs allocated (zeros, shaped and strided as its meta kernel makes them), not computed."""
    if func.overloadpacket.__name__.endswith("_"):
        return args[0]

    def meta(t):
        if isinstance(t, torch.Tensor):
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        return t

    def real(t):
        if isinstance(t, torch.Tensor):
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu").zero_()
        return t

    return tree_map(real, func(*tree_map(meta, args), **tree_map(meta, kwargs)))


def _place(path: str, line: int, fn: str) -> str | None:
    path = os.path.abspath(path)
    if not path.startswith(PKG) or path == SPAWN:
        return None
    return f"{path[len(ROOT) :]}:{line} {fn}"


def _live() -> str | None:
    """The innermost meshplan frame on the Python stack."""
    frame = sys._getframe(2)
    while frame is not None:
        where = _place(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        if where is not None:
            return where
        frame = frame.f_back
    return None


def _recorded(node) -> str | None:
    """The innermost meshplan frame of the forward that made an autograd node (anomaly mode's traceback)."""
    try:
        stack = node.metadata.get("traceback_") or []
    except (AttributeError, RuntimeError):
        return None
    for entry in reversed(stack):
        m = _FRAME.search(entry)
        if m:
            where = _place(m.group(1), int(m.group(2)), m.group(3))
            if where is not None:
                return where
    return None


class _Count(TorchDispatchMode):
    """Bytes by (phase, source line, op); GEMMs and attention kernels allocated, not computed, their bytes
    kept apart (`stubs`). Inside `quiet()` nothing is counted (a Triton kernel's reference ops)."""

    def __init__(self):
        super().__init__()
        self.bytes, self.calls = defaultdict(float), defaultdict(int)
        self.memcpy = defaultdict(float)  # of `bytes`, what a GPU copies with cudaMemcpyAsync
        self.stubs, self.stub_calls = defaultdict(float), defaultdict(int)
        self.other = defaultdict(int)  # ops of other namespaces (c10d collectives): calls
        self.phase = "forward"
        self.silent = 0

    def where(self) -> str:
        node = torch._C._current_autograd_node()
        if node is None:
            return _live() or "(outside meshplan)"
        custom = isinstance(node, BackwardCFunction)
        if custom:
            live = _live()
            if live is not None:
                return live
        made = _recorded(node)
        tag = f" <{node.name().replace('torch::autograd::', '')}>"
        return (made or _live() or "(autograd engine)") + tag

    def add(self, op: str, nbytes: float, stub: bool = False, source: str | None = None) -> None:
        key = (self.phase, source or self.where(), op)
        (self.stubs if stub else self.bytes)[key] += nbytes
        (self.stub_calls if stub else self.calls)[key] += 1

    @contextmanager
    def quiet(self):
        self.silent += 1
        try:
            yield
        finally:
            self.silent -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if func.namespace != "aten":
            self.other[f"{func.namespace}.{name}"] += 1
            return func(*args, **kwargs)
        if name in GEMMS or name.startswith(ATTENTION_PREFIXES):
            out = _allocated(func, args, kwargs)
            if not self.silent:
                self.add(name, _size(list(args)) + _size(list(kwargs.values())) + _size(out), stub=True)
            return out
        out = func(*args, **kwargs)
        if not self.silent and not func.is_view and name not in NO_DATA:
            source = self.where()
            moved = _moved(name, args, kwargs, out)
            self.add(name, moved, source=source)
            if _memcpy(name, args, kwargs):
                self.memcpy[(self.phase, source, name)] += moved
        return out


COUNT: _Count | None = None  # this process's counter, for the stand-ins below


# -- the attention Blocks, allocated, not computed ----------------------------------------------------------


def _stub_forward(q, k, v, causal):
    with COUNT.quiet():
        out, lse = torch.zeros_like(q), torch.zeros(q.shape[:3], dtype=torch.float32)
    COUNT.add("attention block fwd", _size([q, k, v, out, lse]), stub=True)
    return out, lse, None


def _stub_backward(dout, q, k, v, out, lse, causal, extra):
    with COUNT.quiet():
        grads = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    COUNT.add("attention block bwd", _size([dout, q, k, v, out, lse, *grads]), stub=True)
    return grads


# -- the GPU's Triton kernels: their nominal bytes, the reference ops uncounted ----------------------------


class _TritonNorm(torch.autograd.Function):
    """RMSNorm as meshplan.kernels.gated_norm's fused kernels move bytes (rmsnorm_triton on a GPU)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        from meshplan.executor.blocks import rms_norm_rows

        with COUNT.quiet():
            out, rstd = rms_norm_rows(x, weight, eps)
        COUNT.add("triton:rmsnorm_fwd", 2 * _nbytes(x) + _nbytes(weight))
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx, grad):
        from meshplan.executor.blocks import rms_norm_rows_grad

        x, weight, rstd = ctx.saved_tensors
        width = x.shape[-1]
        rows = x.numel() // width
        per_program = max(1, 1024 // (1 << (width - 1).bit_length()))  # gated_norm._fused_launch
        programs = min(-(-rows // per_program), 2112)  # gated_norm.FUSED_BWD_PROGRAMS
        partial = programs * width * 4
        with COUNT.quiet():
            dx, dw = rms_norm_rows_grad(x, weight, rstd, grad)
        COUNT.add("triton:rmsnorm_bwd", 2 * _nbytes(x) + _nbytes(grad) + _nbytes(weight) + partial)
        COUNT.add("sum (rmsnorm dw partials)", partial + width * 4)
        COUNT.add("_to_copy (rmsnorm dw)", width * 4 + _nbytes(dw))
        return dx, dw, None


def _norm_forward(self, x):
    return _TritonNorm.apply(x, self.weight, self.eps)


def _rotary_apply(original):
    def apply(self, t, positions, inverse=False):
        with COUNT.quiet():
            original(self, t, positions, inverse)
        COUNT.add("triton:rotary", 2 * _nbytes(t))
        return t

    return apply


def _swiglu(original):
    def fwd(h):
        with COUNT.quiet():
            out = original(h)
        COUNT.add("triton:swiglu_fwd", _nbytes(h) + _nbytes(out))
        return out

    return fwd


def _swiglu_grad(original):
    def bwd(h, grad):
        with COUNT.quiet():
            dh = original(h, grad)
        COUNT.add("triton:swiglu_bwd", 2 * _nbytes(h) + _nbytes(grad))
        return dh

    return bwd


def _ce_stand_ins():
    """meshplan.kernels.cross_entropy's three passes as torch ops (quiet), counted as the kernels move bytes."""

    def row_stats(logits, labels, start):
        with COUNT.quiet():
            z = logits.float()
            m = z.amax(-1)
            s = torch.exp(z - m[:, None]).sum(-1)
            inside = (labels >= start) & (labels < start + z.shape[-1])
            t = torch.where(inside, z.gather(1, torch.where(inside, labels - start, 0)[:, None])[:, 0], 0.0)
        COUNT.add("ce:stats", _nbytes(logits) + 3 * _nbytes(m))
        return m, s, t

    def exponentials(logits, top):
        with COUNT.quiet():
            z = torch.exp(logits.float() - top[:, None])
        COUNT.add("ce:exps", _nbytes(logits) + _nbytes(z))
        return z

    def logits_grad(z, sums, idx, inside, grad, dtype):
        with COUNT.quiet():
            d = z / sums[:, None]
            d[torch.arange(len(idx)), idx] -= inside.to(d.dtype)
            out = (d * grad[:, None]).to(dtype)
        COUNT.add("ce:grad", _nbytes(z) + _nbytes(out))
        return out

    return row_stats, exponentials, logits_grad


@contextmanager
def _patched(gpu_kernels: bool):
    """The stubs and stand-ins in place, the executor's own functions back afterwards."""
    import meshplan.executor.attention as attention
    import meshplan.executor.blocks as blocks
    import meshplan.executor.layouts.tsp as tsp
    import meshplan.executor.rotary as rotary

    stub = attention.Blocks("stub", _stub_forward, _stub_backward)
    saved = [
        (attention, "shard_blocks", lambda q, k, v: stub),
        (attention, "run_blocks", lambda q, k, v, runs: stub),
    ]
    if gpu_kernels:
        import meshplan.executor.layouts.vocab as vocab
        import meshplan.kernels.cross_entropy as cross_entropy

        stats, exps, grad = _ce_stand_ins()
        saved += [
            (vocab, "_ce_kernels", lambda t: True),
            (cross_entropy, "row_stats", stats),
            (cross_entropy, "exponentials", exps),
            (cross_entropy, "logits_grad", grad),
            (blocks.RMSNorm, "forward", _norm_forward),
            (rotary.Rotary, "apply", _rotary_apply(rotary.Rotary.apply)),
            (tsp, "swiglu", _swiglu(tsp.swiglu)),
            (tsp, "swiglu_grad", _swiglu_grad(tsp.swiglu_grad)),
        ]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in saved]
    for owner, name, value in saved:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in originals:
            setattr(owner, name, value)


def _rank(rank: int, world: int, seq: int, gpu_kernels: bool, model=None, batch: int = 1) -> dict:
    """One counted training forward, backward and gradient sync on this rank, as run.measure's eager step
    runs them (no optimizer step): of `model` (dense-7b at 2 layers in bf16 by default) under tsp=`world`,
    `batch` sequences of `seq` tokens."""
    global COUNT
    from meshplan.executor.comm import build_mesh
    from meshplan.executor.parallelize import GradientSync, keep_caches, run_layers
    from meshplan.executor.run import _build, _token_inputs
    from meshplan.layout import parse_layout
    from meshplan.models import PRESETS

    if model is None:
        model = replace(PRESETS["dense-7b"], layers=2, name="dense-7b/2L", param_dtype="bf16")
    mesh = build_mesh(parse_layout(f"tsp={world}"))
    t0 = time.perf_counter()
    layers = _build(model, mesh, seq, "cpu", whole=True, int8_allreduce=False, checkpoint=None)
    built_s = time.perf_counter() - t0
    head = layers[-1]
    x, labels = _token_inputs(model, mesh, layers, seq, batch, "cpu", None)
    head.scale = 1.0 / (batch * seq)  # 1 / (micro-batches · batch · seq)
    head.labels = [labels]
    sync = GradientSync(layers, mesh, None, tied=model.tied_embeddings)
    keep_caches(layers, False)
    dy = torch.ones((), dtype=torch.float32)
    COUNT = _Count()
    t0 = time.perf_counter()
    torch.autograd.set_detect_anomaly(True, check_nan=False)
    with _patched(gpu_kernels), COUNT:
        loss = run_layers(layers, x)
        COUNT.phase = "backward"
        loss.backward(dy)
        COUNT.phase = "grad sync"
        sync.finish()
    torch.autograd.set_detect_anomaly(False)
    return {
        "bytes": dict(COUNT.bytes),
        "calls": dict(COUNT.calls),
        "memcpy": dict(COUNT.memcpy),
        "stubs": dict(COUNT.stubs),
        "stub_calls": dict(COUNT.stub_calls),
        "other": dict(COUNT.other),
        "build_s": built_s,
        "count_s": time.perf_counter() - t0,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
    }


def _lines(obj) -> tuple[str, range]:
    """The repository path and line range of a class's or function's source."""
    lines, start = inspect.getsourcelines(obj)
    return os.path.relpath(inspect.getsourcefile(obj), ROOT), range(start, start + len(lines))


def tsp_motion(r: dict) -> dict[str, float]:
    """A rank's counted bytes that costmodel/axes/tsp.py prices as TSP's motion, by part and phase:
    "attention", "mlp" — the torch ops of executor/layouts/tsp.py's attention and MLP Functions (not their
    Triton kernels, nor the autograd nodes of the norms before them), the attention's with the copies
    comm.all_gather_start makes of the K/V it gathers and the contiguous rank chunks comm.reduce_scatter makes
    of their gradients; "mamba2" — executor/layouts/tsp_mamba.py's Function, ring gather and layer (its
    shards' packing and unpacking); "router", "shared gate" — an MoE block's RingRowsFn and RingColumnsFn (its
    shared expert's ring is _TSPMlpFn's: "mlp"); "head" — _TSPLogits's (executor/layouts/vocab.py); "loss" —
    its cross-entropy's (_VocabParallelCE; compute.executor_loss_bytes prices it)."""
    from meshplan.executor import comm
    from meshplan.executor.layouts import tsp, tsp_mamba, vocab

    # comm.reduce_scatter's lines that lay the rank chunks out for NCCL (a copy only where a batch's rows put
    # them in pieces; not the gloo stand-in's slice after its all-reduce)
    path, span = _lines(comm.reduce_scatter)
    source, _ = inspect.getsourcelines(comm.reduce_scatter)
    chunks = [span.start + i for i, text in enumerate(source) if text.strip().startswith("chunks = ")]
    parts = {
        "attention": [_lines(tsp._TSPAttentionFn), _lines(comm.all_gather_start), (path, chunks)],
        "mlp": [_lines(tsp._TSPMlpFn)],
        "router": [_lines(tsp.RingRowsFn)],
        "shared gate": [_lines(tsp.RingColumnsFn)],
        "mamba2": [_lines(tsp_mamba._TSPMamba2Fn), _lines(tsp_mamba.ring_gather)]
        + [_lines(getattr(tsp_mamba.TSPMamba2, name)) for name in ("pack", "unpack", "gather", "pack_all")],
        "head": [_lines(vocab._TSPLogits)],
        "loss": [_lines(vocab._VocabParallelCE), _lines(vocab._accumulator), _lines(vocab._fused_forward)],
    }
    out = {f"{part} {phase}": 0.0 for part in parts for phase in ("forward", "backward")}
    for (phase, source, op), nbytes in r["bytes"].items():
        m = re.match(r"(\S+):(\d+) ", source)
        tagged = re.search(r" <[A-Z_][^>]*>$", source)  # an autograd node's op: the norms', the residual's
        if not m or tagged or op.startswith("triton:") or phase not in ("forward", "backward"):
            continue
        path, line = m.group(1), int(m.group(2))
        for part, spans in parts.items():
            if any(path == p and line in span for p, span in spans):
                out[f"{part} {phase}"] += nbytes
    return out


def _code(source: str) -> str:
    """The text of a "path:line fn" source's line."""
    m = re.match(r"(\S+):(\d+) ", source)
    if not m:
        return ""
    return linecache.getline(os.path.join(ROOT, m.group(1)), int(m.group(2))).strip()[:70]


def _short(source: str) -> str:
    return source.replace("meshplan/executor/", "")


def _report(r: dict, rank: int, top: int) -> None:
    total = sum(r["bytes"].values())
    calls = sum(r["calls"].values())
    gemm = sum(r["stubs"].values())
    print(f"\n== rank {rank}: {total / 1e9:.3f} GB in {calls} counted ops = {total / HBM_BYTES_PER_S * 1e3:.3f} ms at "
          f"{HBM_BYTES_PER_S / 1e12:.1f} TB/s; gemm/attention (stubbed, not in the total): {gemm / 1e9:.3f} GB "
          f"in {sum(r['stub_calls'].values())} calls")  # fmt: skip
    motion = ", ".join(f"{k} {v / 1e9:.3f} GB" for k, v in tsp_motion(r).items())
    print(f"   of which TSP's motion as costmodel/axes/tsp.py prices it: {motion}")
    by_phase = defaultdict(float)
    by_op = defaultdict(float)
    op_calls = defaultdict(int)
    for (phase, _, op), b in r["bytes"].items():
        by_phase[phase] += b
        by_op[op] += b
        op_calls[op] += r["calls"][(phase, _, op)]
    copied = sum(r["memcpy"].values())
    print(f"   of which a GPU's cudaMemcpyAsync (same-layout copy_, clone): {copied / 1e9:.3f} GB = "
          f"{copied / HBM_BYTES_PER_S * 1e3:.3f} ms; the rest, kernels: {(total - copied) / 1e9:.3f} GB = "
          f"{(total - copied) / HBM_BYTES_PER_S * 1e3:.3f} ms")  # fmt: skip
    print("   by phase: " + ", ".join(f"{p} {b / 1e9:.3f} GB" for p, b in by_phase.items()))
    print("   by op:")
    for op, b in sorted(by_op.items(), key=lambda kv: -kv[1]):
        if b >= 1e6:
            print(f"      {op:34s} x{op_calls[op]:4d} {b / 1e9:8.3f} GB {b / HBM_BYTES_PER_S * 1e6:8.1f} us")
    if rank != 0:
        return
    by_source = defaultdict(float)
    source_ops = defaultdict(lambda: defaultdict(float))
    for (phase, source, op), b in r["bytes"].items():
        key = (phase, source)
        by_source[key] += b
        source_ops[key][op] += b
    print(f"\n   rank 0 by source line ({top} largest; phase, line, GB, us at 4.8 TB/s, ops):")
    for (phase, source), b in sorted(by_source.items(), key=lambda kv: -kv[1])[:top]:
        ops = ", ".join(f"{op} {x / 1e9:.3f}" for op, x in sorted(source_ops[(phase, source)].items(),
                                                                    key=lambda kv: -kv[1]))  # fmt: skip
        print(f"   {phase[:4]:4s} {_short(source):60s} {b / 1e9:7.3f} GB {b / HBM_BYTES_PER_S * 1e6:7.1f} us  [{ops}]")
        print(f"        | {_code(source)}")
    print("\n   rank 0 by source line and op (all of 1 MB or more): phase, line, op, calls, GB (* a GPU's memcpy)")
    for key, b in sorted(r["bytes"].items(), key=lambda kv: -kv[1]):
        if b >= 1e6:
            phase, source, op = key
            mark = "*" if r["memcpy"].get(key, 0) > 0.5 * b else " "
            print(f"   {phase[:4]:4s} {_short(source):68s} {op:28s} x{r['calls'][key]:3d} {b / 1e9:7.3f}{mark}")
    print("\n   rank 0 gemm/attention stubbed (not in the total): phase, line, op, calls, GB")
    for (phase, source, op), b in sorted(r["stubs"].items(), key=lambda kv: -kv[1]):
        n = r["stub_calls"][(phase, source, op)]
        print(f"   {phase[:4]:4s} {_short(source):68s} {op:28s} x{n:3d} {b / 1e9:7.3f}")
    print("   collectives and other non-aten ops (calls): " + ", ".join(f"{k} x{n}" for k, n in r["other"].items()))


def main() -> None:
    from meshplan.executor.distributed import run_distributed

    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--cpu-paths", action="store_true", help="count the CPU reference ops of the Triton kernels")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--timeout", type=float, default=1800.0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    ranks = run_distributed(_rank, 2, args.seq, not args.cpu_paths, timeout_s=args.timeout)
    kernels = "CPU reference ops counted" if args.cpu_paths else "Triton kernels as their nominal bytes"
    print(f"# PYTHONPATH=. python benchmarks/tsp_bytes.py --seq {args.seq}{' --cpu-paths' if args.cpu_paths else ''}"
          f": dense-7b/2L bf16, whole model, tsp=2, one training forward + backward + grad sync; {kernels}; "
          f"torch {torch.__version__}, {time.perf_counter() - t0:.0f} s wall")  # fmt: skip
    for rank, r in enumerate(ranks):
        print(f"# rank {rank}: built in {r['build_s']:.0f} s, counted in {r['count_s']:.0f} s, "
              f"peak RSS {r['peak_rss_gb']:.1f} GB")  # fmt: skip
    for rank, r in enumerate(ranks):
        _report(r, rank, args.top)


if __name__ == "__main__":
    main()

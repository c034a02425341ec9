"""Run a layout for real and measure it next to the cost model's prediction.

Measured, per rank: step time (CUDA events after warm-up, median), peak memory
(torch.cuda.max_memory_allocated over the timed steps, or over the capture of a step replayed as a CUDA
graph: executor.graphs), collective bytes by kind/axis (the counting
wrapper), bytes saved for backward (saved_tensors_hooks), and the exposed communication: the same
step timed again with the transfers skipped (counted, not sent), subtracted from the real one.
The prediction a run file sets beside these is meshplan.predict.predict_run.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from dataclasses import replace

import torch

from meshplan.costmodel.axes.pp import stream_width
from meshplan.costmodel.options import CostOptions
from meshplan.executor import graphs
from meshplan.executor.blocks import Stack
from meshplan.executor.checkpoint import load_into
from meshplan.executor.comm import Mesh
from meshplan.executor.layouts.vocab import ParallelHead
from meshplan.executor.model import CausalLM, synthetic_tokens
from meshplan.executor.optim import make_optimizer
from meshplan.executor.parallelize import (
    GradientSync,
    drop_caches,
    keep_caches,
    parallelize,
    parallelize_model,
    run_layers,
    set_documents,
    shard_weights,
    share_final_states,
    stage_of,
    token_positions,
    unique_params,
)
from meshplan.executor.pipeline import Pipeline, through
from meshplan.executor.saved import count_saved_bytes
from meshplan.layout import Layout
from meshplan.models import ModelSpec

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def use_expandable_segments() -> None:
    """Expandable allocator segments unless the user chose a configuration; call before CUDA starts.

    Large transient buffers (a 1M-token Mamba-2 layer's fp32 chunk states are 20-40 GiB each) fragment
    the caching allocator's fixed segments: mamba2-2.7b/2L at 512K tokens ran out of memory with 137 GiB
    in use, and fit at a 115 GiB peak with expandable segments
    (benchmarks/results/validation-h200-run12-x2-mamba2-long.json against run13)."""
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


def copy_roofline_bytes_per_s(reps: int = 10, warmup: int = 2) -> float:
    """Bytes a second a device-to-device copy of 1 GiB moves (read and write): the roofline the kernel
    benchmarks divide their traffic by."""
    big = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    return 2 * big.numel() / median_time_s(lambda: big.clone(), reps=reps, warmup=warmup)


def median_time_s(fn, reps: int = 10, warmup: int = 3) -> float:
    """Median seconds of fn on the GPU after `warmup` untimed calls (CUDA events)."""
    for _ in range(warmup):
        fn()
    return statistics.median(timed(fn, reps, cuda=True))


def graph_replay_s(fn, reps: int = 10, warmup: int = 3) -> float:
    """Median seconds of one replay of fn captured as a CUDA graph — the GPU's time, with no host issuing its
    kernels — after `warmup` calls on a side stream (where Triton autotunes and the allocator settles)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 1)):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return median_time_s(graph.replay, reps)


def kernel_times(fn, names, reps: int = 5) -> dict:
    """Mean CUDA seconds per call of fn spent in each named kernel (torch.profiler), and in all the
    others together under "other" (torch's small ops around them)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out = dict.fromkeys(names, 0.0)
    out["other"] = 0.0
    for ev in prof.key_averages():
        t = ev.device_time_total / 1e6 / reps
        if t > 0:
            out[ev.key if ev.key in names else "other"] += t
    return out


def timed(fn, steps: int, cuda: bool, after=None) -> list[float]:
    """Seconds per call of fn, with CUDA events on the GPU (after the caller's warm-up); `after(i, s)`
    is called outside the timed region once call i has taken s seconds."""
    times = []
    for i in range(steps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        if after is not None:
            after(i, times[-1])
    return times


class Ticks:
    """A run's units of work (warm-up and timed steps, the extra measurements) as they finish:
    `report(done, total, what, seconds)` after each, for `meshplan execute`'s progress bar."""

    def __init__(self, report, total: int, cuda: bool):
        self.report, self.total, self.cuda, self.done = report, total, cuda, 0

    def __call__(self, what: str, seconds: float | None = None) -> None:
        self.done += 1
        if self.report is not None:
            self.report(self.done, self.total, what, seconds)

    def run(self, fn, what: str):
        """fn(), timed on the host (after the GPU has finished it), then reported."""
        t0 = time.perf_counter()
        out = fn()
        if self.cuda:
            torch.cuda.synchronize()
        self(what, time.perf_counter() - t0)
        return out


def measure(
    model: ModelSpec,
    layout: Layout,
    mesh: Mesh,
    seq: int,
    batch: int,
    mode: str,
    *,
    steps: int = 5,
    warmup: int = 2,
    device: str = "cuda",
    dtype: str = "bf16",
    exposed: bool = True,
    profile: bool = False,
    int8_allreduce: bool = False,
    host_samples: int = 3,
    whole: bool = False,
    tokens: tuple | None = None,
    checkpoint: str | None = None,
    progress=None,
    cuda_graph: bool | None = None,
) -> dict:
    """Build, shard and run the model on this rank; returns this rank's measurements. `whole`: the whole
    model from token ids to the loss (`tokens`: its (ids, labels, documents or None), synthetic when None),
    else the layer stack on random hidden states. `int8_allreduce`: TP-SSM's block all-reduce in int8 (forward;
    meshplan.executor.comm.quantized_all_reduce). `host_samples`: times the host's issue time of a
    step is taken (their median is reported). `checkpoint`: a checkpoint folder each rank reads its shard of
    (executor.checkpoint); the result then holds the loss of the first batch before any step ("loss").
    `progress(done, total, what, seconds)`: called as each step or measurement finishes (Ticks).
    `cuda_graph`: time the training step captured as a CUDA graph and replayed (executor.graphs) —
    None: wherever graphs.limits allows, True: or fail saying why not, False: never. The result's
    "cuda_graph" says whether it was, and "cuda_graph_not" why not."""
    cuda = device.startswith("cuda")
    model = replace(model, param_dtype=dtype)
    layers = _build(model, mesh, seq, device, whole=whole, int8_allreduce=int8_allreduce, checkpoint=checkpoint)
    t_local = len(token_positions(mesh, seq))
    train = mode == "train"
    gen = torch.Generator(device=device).manual_seed(mesh.rank)
    # Hidden states: the stack's input; for the whole model, what a later pipeline stage receives (none
    # without pp, where an unused tensor of the sequence's width would count in the measured peak).
    width = stream_width(model) if whole else model.d_model  # a Zamba2's stages send its embeddings too
    hidden = (
        torch.randn(batch, t_local, width, dtype=DTYPES[dtype], device=device, generator=gen)
        if not whole or layout.pp > 1
        else None
    )
    head = layers[-1] if isinstance(layers[-1], ParallelHead) else None
    micro = CostOptions().microbatches_for(layout.pp) if train else 1
    if whole:
        x, labels = _token_inputs(model, mesh, layers, seq, batch, device, tokens)
        # The loss on the last stage starts the backward; between stages, hidden-state gradients.
        dy = torch.ones((), dtype=torch.float32, device=device) if train else None
        if head is not None:
            head.scale = 1.0 / (micro * batch * seq)
    else:
        x = hidden
        dy = torch.randn(x.shape, dtype=x.dtype, device=device, generator=gen) if train else None
        x.requires_grad_(train)

    def feed(n: int) -> None:
        """The labels of the next n training forwards (none: inference predicts the next token)."""
        if head is not None:
            head.labels = [labels] * n

    weights = shard_weights(layers, mesh)  # ZeRO 3
    sync = GradientSync(layers, mesh, weights, tied=whole and model.tied_embeddings) if train else None
    opt = make_optimizer(unique_params(layers), sync) if train else None
    # Pipeline stages: the cost model's micro-batches a training step, the same one each (timing only).
    pipe = Pipeline(layers, mesh, run_layers, like=hidden if whole else None) if layout.pp > 1 else None
    keep_caches(layers, not train)
    decode = mode == "decode"
    if decode:  # prefill once (not timed); the timed steps decode one token per sequence each
        x = _prefill(layers, pipe, x, model, batch, device, DTYPES[dtype], gen, whole=whole)
        # The prefill's input goes with it: the decode steps hold the caches, not a (b, s, h) tensor (kept
        # alive here it added 1 GiB to every 16K decode peak of batch 8 from commit bf7185d on: the
        # census in benchmarks/probes/decode_census_probe.py)
        hidden = None

    def eager_step():
        if decode:
            through(layers, pipe, x, lambda layer, h: layer.decode(h))
        elif train:
            feed(micro)
            if pipe is not None:
                pipe.train([x] * micro, [dy] * micro, sync)
            else:
                run_layers(layers, x).backward(dy)
            sync.finish()
            opt.step()
            opt.zero_grad()
            x.grad = None
        else:
            drop_caches(layers)  # the previous prefill's, before making the next
            with torch.no_grad():
                through(layers, pipe, x)
        if pipe is not None and not train:
            # One request's time through every stage, as the model prices it: without this the first
            # stage would start the next request while the last finishes this one, and the steps
            # would time the pipeline's throughput (half the latency at pp=2: run 51).
            torch.distributed.barrier(group=mesh.axis("pp").group)

    # With the transfers skipped, ZeRO 3 would compute on weights it never gathered (run 49 read 22 ms
    # "exposed" at 16K that way), and pipeline stages would stop waiting for each other (their bubbles
    # gone: run 51 read 134 ms at 16K): neither's exposed communication is measured.
    no_comm = exposed and mesh.world > 1 and weights is None and pipe is None
    graph_not = (
        graphs.limits(layout, model, mode, device, int8_allreduce)
        if cuda_graph is not False
        else "cuda_graph: turned off"
    )
    if graph_not is None:
        graph_not = opt.on_device_scalars()
    if cuda_graph and graph_not is not None:
        raise graphs.CaptureFailed(f"cuda_graph: this step cannot be captured ({graph_not})")
    step = eager_step
    tick = Ticks(
        progress,
        (1 if whole and train else 0)
        + warmup
        + steps
        + (1 if train else 0)
        + ((warmup + steps) if no_comm else 0)
        + ((host_samples + (1 if profile else 0)) if cuda else 0),
        cuda,
    )
    first_loss = (
        tick.run(lambda: _first_loss(layers, pipe, x, head, mesh, micro, feed), "first-batch loss")
        if whole and train
        else None
    )
    for i in range(warmup):
        tick.run(step, f"warm-up step {i + 1}/{warmup}")

    def count_saved() -> float:
        """One micro-batch through this rank's layers alone (a later stage's input a copy of its own)."""
        feed(1)
        inp = x if pipe is None or pipe.first else hidden.detach().clone().requires_grad_()
        out = tick.run(
            lambda: _saved_bytes(layers, inp, dy if head is not None or not whole else None, sync, opt),
            "saved activations counted",
        )
        x.grad = None
        return out

    # Under a graph, counted before the capture: an eager pass beside a live graph's pool would need
    # its memory twice.
    saved = count_saved() if train and graph_not is None else None
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    if graph_not is None:
        step = _graphed(layers, x, dy, sync, opt, eager_step, feed, micro, mesh)
    try:
        mesh.reset_counts()
        times = timed(step, steps, cuda, after=lambda i, t: tick(f"step {i + 1}/{steps}", t))
        result = {
            "step_time_s": statistics.median(times),
            "step_times_s": times,
            "comm_bytes": {k: v / steps for k, v in mesh.counts.items()},
            "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
            "loss": first_loss,
            "cuda_graph": graph_not is None,
        }
        if graph_not is not None and cuda:
            result["cuda_graph_not"] = graph_not
        if cuda:
            result.update(_gpu_extras(step, host_samples, profile, tick, mesh))
            result["peak_bytes"] += result["peer_buffer_bytes"]
        if train:
            result["saved_bytes"] = saved if saved is not None else count_saved()
        if no_comm:
            result["step_time_no_comm_s"] = _time_without_comm(step, mesh, warmup, steps, cuda, tick)
            result["exposed_comm_s"] = result["step_time_s"] - result["step_time_no_comm_s"]
        if cuda:  # the next run, perhaps on other groups, starts without this one's peer buffers
            from meshplan.executor import peer

            peer.release([ax.group for ax in mesh.axes.values() if ax is not None and ax.group is not None])
        return result  # the stack, optimizer and caches go with this frame; callers empty the CUDA cache
    finally:
        # Captured collectives go before the process group does (ones that outlived it hung a run at exit).
        _reset_graphs(getattr(step, "graphs", []))


def _reset_graphs(made: list) -> None:
    """Reset the CUDA graphs in `made` (their pools freed) once the GPU is done with them, and forget them."""
    if made:
        torch.cuda.synchronize()
        for graph in made:
            graph.reset()
        made.clear()
        torch.cuda.empty_cache()


def _graphed(layers, x, dy, sync, opt, eager_step, feed, micro: int, mesh: Mesh):
    """The training step captured (executor.graphs.capture) — the forward, backward, the gradient
    reductions, the optimizer's kernels and the gradients let go, the labels fed as the eager step
    feeds them — and a step that counts it (the bias corrections written, the capture's collective
    bytes added to the mesh's counts) and replays it. The capture's allocations set the peak.
    `replay.without_comm()`: the same step captured anew with the transfers skipped (mesh.enabled off,
    as _time_without_comm times the eager step), once the first graph is reset. The optimizer is made to
    read its bias corrections from the device first (a graph captured with them as host constants steps
    every replay with the capture's: session 22's probe did, and read that as a graph-vs-eager gap)."""

    if opt.scalars is None:  # a captured Adam with host scalars would replay step 1's bias corrections
        why = opt.on_device_scalars()
        if why is not None:
            raise graphs.CaptureFailed(f"cuda_graph: this step cannot be captured ({why})")

    def body():
        feed(micro)
        run_layers(layers, x).backward(dy)
        sync.finish()
        opt.apply()
        opt.zero_grad()
        x.grad = None

    made = []  # every graph captured: reset before the process group goes (measure's end)

    def captured():
        graph = graphs.capture(body, eager_step, ready=mesh.reset_counts)
        made.append(graph)
        counts, calls = dict(mesh.counts), dict(mesh.calls)

        def replay():
            opt.advance()
            graph.replay()
            for key, n in counts.items():
                mesh.counts[key] += n
                mesh.calls[key] += calls[key]

        return replay

    def without_comm():
        # The timed graph is done with: its pool goes before the next capture (a live pool and an eager
        # warm-up beside it would hold the step's transients twice).
        _reset_graphs(made)
        return captured()

    step = captured()
    step.without_comm = without_comm
    step.graphs = made
    return step


def _build(
    model: ModelSpec, mesh: Mesh, seq: int, device: str, *, whole: bool, int8_allreduce: bool, checkpoint: str | None
) -> torch.nn.ModuleList:
    """This rank's modules: every rank builds the same seeded reference and keeps its shard; with a
    `checkpoint`, each rank then reads its slices of the real weights."""
    torch.manual_seed(1234)
    with torch.device(device):
        if whole:
            layers = parallelize_model(CausalLM(model).to(DTYPES[model.param_dtype]), mesh, seq, int8_allreduce)
            if checkpoint is not None:
                load_into(layers, checkpoint, model)
        else:
            stack = Stack(model, model.layers).to(DTYPES[model.param_dtype])
            layers = parallelize(stage_of(stack, mesh), mesh, seq, int8_allreduce)
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return layers


def _saved_bytes(layers, inp: torch.Tensor, dy: torch.Tensor | None, sync, opt) -> float:
    """Bytes autograd saves for backward in one forward of `layers` (executor.saved); the backward
    after it (with `dy`, or a random gradient on a stage's hidden output) leaves no gradient behind."""
    with count_saved_bytes(unique_params(layers)) as saved:
        y = run_layers(layers, inp)
    y.backward(dy if dy is not None else torch.randn_like(y))
    sync.finish()  # the reductions its hooks started
    sync.clear()
    opt.zero_grad()
    return saved["bytes"]


def _token_inputs(model: ModelSpec, mesh: Mesh, layers, seq: int, batch: int, device: str, tokens: tuple | None):
    """(ids, labels) on the device — `tokens`, or one synthetic batch a data-parallel replica (the ranks
    that split one sequence must see the same ids) — with packed documents handed to the Mamba-2 layers."""
    layout = mesh.layout
    replica = torch.Generator(device=device).manual_seed(mesh.axis("dp").rank if layout.dp > 1 else 0)
    ids, labels, documents = (
        tokens
        if tokens is not None
        else (*synthetic_tokens(model.vocab, batch, seq, generator=replica, device=device), None)
    )
    if documents is not None:
        set_documents(layers, documents.to(device))
    return ids.to(device), labels.to(device)


def _prefill(layers, pipe, x, model: ModelSpec, batch: int, device: str, dtype, gen, *, whole: bool):
    """Prefill once (not timed) and keep the caches; returns the decode steps' input: one new token id
    (or hidden state, for the layer stack) per sequence."""
    with torch.no_grad():
        through(layers, pipe, x)
    keep_caches(layers, False)
    share_final_states(layers)
    one = torch.randn(batch, 1, model.d_model, dtype=dtype, device=device, generator=gen)
    if not whole:
        return one
    if pipe is not None:
        pipe.like = torch.randn(batch, 1, stream_width(model), dtype=dtype, device=device, generator=gen)
    return torch.randint(0, model.vocab, (batch, 1), device=device, generator=gen)


def _first_loss(layers, pipe, x, head, mesh: Mesh, micro: int, feed) -> float | None:
    """The mean cross-entropy of the batch before any optimizer step, on the last stage's ranks (None on
    the others): each holds its tokens' scaled sum, summed over the token axis and averaged over the
    data-parallel replicas (outside the counted traffic)."""
    feed(1)
    with torch.no_grad():
        y = through(layers, pipe, x)
    if head is None:
        return None
    total = y.detach().float().reshape(1) * micro
    layout = mesh.layout
    for axis in (layout.sequence_axis, "dp" if layout.dp > 1 else None):
        if axis is not None:
            torch.distributed.all_reduce(total, group=mesh.axis(axis).group)
    return float(total) / layout.dp


PROFILE_TOP = 20  # kernels named in a profiled run (`execute --profile`), with the count launched a step


def _gpu_extras(step, host_samples: int, profile, tick, mesh: Mesh) -> dict:
    """What a GPU run records beside time and peak: the int8 all-reduce's peer buffer (device memory
    outside torch's allocator, added to the peak), the host's issue time of a step, the cuBLAS
    workspaces, with `profile` one more step's GPU time by kernel category, and the allocator's reserved
    peak and what lies beside it."""
    from meshplan.executor import peer

    out = {"peer_buffer_bytes": peer.buffer_bytes()}
    # The host's share: seconds to issue one step from an idle GPU, not waiting for it.
    out["host_enqueue_samples_s"] = [
        tick.run(lambda: _host_enqueue_s(step), f"host issue time {i + 1}/{host_samples}") for i in range(host_samples)
    ]
    out["host_enqueue_s"] = statistics.median(out["host_enqueue_samples_s"])
    if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
        # cuBLAS / cuBLASLt workspaces come from the caching allocator and count in the peak: measure them.
        held = torch.cuda.memory_allocated()
        torch._C._cuda_clearCublasWorkspaces()
        out["blas_workspace_bytes"] = held - torch.cuda.memory_allocated()
    if profile:
        from meshplan.executor.profiling import profile_step

        out["phases_s"] = tick.run(
            lambda: profile_step(
                step, top=profile if isinstance(profile, int) and profile > 1 else PROFILE_TOP, line_up=mesh.line_up
            ),
            "profiled step",
        )
    # What the caching allocator reserved at its peak, and what the driver holds beyond the allocator (the
    # CUDA context, library modules, NCCL's communicator buffers: meshplan/costmodel/runtime.py)
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    out["outside_allocator_bytes"] = total - free - torch.cuda.memory_reserved()
    return out


def _time_without_comm(step, mesh: Mesh, warmup: int, steps: int, cuda: bool, tick) -> float:
    """The median step with every transfer counted but not sent (the exposed communication is the
    difference from the real step)."""
    mesh.enabled = False
    try:
        if hasattr(step, "without_comm"):  # a replayed graph: its transfers are in it; capture one without
            step = step.without_comm()
        for i in range(warmup):
            tick.run(step, f"warm-up step {i + 1}/{warmup} without communication")
        return statistics.median(
            timed(step, steps, cuda, after=lambda i, t: tick(f"step {i + 1}/{steps} without communication", t))
        )
    finally:
        mesh.enabled = True


def _host_enqueue_s(step) -> float:
    """Wall seconds the host spends issuing `step` after the GPU has drained. Where the GPU keeps up
    with the host, the step takes about this long; where a step synchronizes inside, it includes the
    wait."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    out = time.perf_counter() - t0
    torch.cuda.synchronize()
    return out


def environment() -> dict:
    import platform

    env = {"torch": torch.__version__, "python": platform.python_version()}
    # the settings a step's capture depends on (executor/graphs.py)
    for key in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "NCCL_GRAPH_REGISTER"):
        if key in os.environ:
            env[key] = os.environ[key]
    if torch.cuda.is_available():
        env.update(
            gpu=torch.cuda.get_device_name(0),
            cuda=torch.version.cuda,
            nccl=".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None,
        )
    return env


def combine_ranks(ranks: list) -> dict:
    """The step is as slow as its slowest rank; memory as high as its fullest; bytes are averaged."""
    bad = [r for r in ranks if r is None or "error" in r or r.get("oom")]
    if bad:
        return bad[0] or {"error": "rank returned nothing"}
    out = {
        "cuda_graph": all(r.get("cuda_graph", False) for r in ranks),
        "step_time_s": max(r["step_time_s"] for r in ranks),
        "peak_bytes": max(r["peak_bytes"] or 0 for r in ranks) or None,
        "loss": next((r["loss"] for r in ranks if r.get("loss") is not None), None),
    }
    keys = set().union(*(r["comm_bytes"] for r in ranks))
    out["comm_bytes"] = {k: sum(r["comm_bytes"].get(k, 0.0) for r in ranks) / len(ranks) for k in keys}
    if "blas_workspace_bytes" in ranks[0]:
        out["blas_workspace_bytes"] = ranks[0]["blas_workspace_bytes"]
    for key in ("peak_reserved_bytes", "outside_allocator_bytes"):
        if key in ranks[0]:
            out[key] = max(r[key] for r in ranks)
    if "saved_bytes" in ranks[0]:
        out["saved_bytes"] = max(r["saved_bytes"] for r in ranks)
    if "host_enqueue_s" in ranks[0]:
        out["host_enqueue_s"] = max(r["host_enqueue_s"] for r in ranks)
    if ranks[0].get("phases_s"):
        out["phases_s"] = ranks[0]["phases_s"]  # rank 0's profile
    if "exposed_comm_s" in ranks[0]:
        out["exposed_comm_s"] = max(r["exposed_comm_s"] for r in ranks)
        out["step_time_no_comm_s"] = max(r["step_time_no_comm_s"] for r in ranks)
    return out

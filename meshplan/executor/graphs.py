"""A training step captured once as a CUDA graph and replayed: the host issues one launch a step
instead of every kernel's (issue #34: at 4K tokens the 7B-shaped 2-layer step's GPU waited on the host
for 1.1 of 26.5 ms, benchmarks/results/gaps-4k-h100.json).

What is captured is the step as the eager executor runs it — forward, backward, the optimizer's kernels
(optim.MixedAdam.apply, reading its bias corrections from device memory that `advance` fills before
each replay), the gradients let go — so the kernels, the tensors saved for backward and the memory they
take are the eager step's: the graph's private memory pool is allocated during capture as the caching
allocator allocates the eager step, freed blocks reused within it, and its peak is what
`max_memory_allocated` reads after the capture. A replay allocates nothing.

Only what has no host round trip in its step is captured: training, no pipeline (its stages meet on the
host's schedule), no mixture of experts (the all-to-all's split sizes come to the host once a layer),
no ZeRO (its gathers land through host-side bookkeeping) and no int8 all-reduce (its peer path meets at
barriers); and, by measurement, not Zamba2's hybrids (their capture was invalidated on an H200), which run
eagerly. TSP's rings, and collectives over several mesh axes, replay once NCCL stops registering the graph's
buffers in the allocator's expandable segments (ring_env; sessions 21-23 read the hang that registration made as
TSP's own; session 26 met it under tp=2,sp=2). Mamba-2 under a
tensor axis was refused from session 21 to 23 after a slow replay; session 23 captured mamba2-130m at tpssm=2
(73-79 ms a 16K packed step, against 144 ms eager in session 21), its weights after 3 steps at 2K tokens equal
to an eager run's (benchmarks/results/s23-h200x2-graphs/); other degrees and mixed stacks are not measured.
Collectives are captured with the step (NCCL ≥ 2.9.6 records them into the graph); their bytes, counted on the
host as the capture issues them, are added to the run's counts at each replay. `limits` says why a run is not
captured, in one line.
"""

from __future__ import annotations

import os

from meshplan.layout import Layout
from meshplan.models import ModelSpec

# NCCL registers the buffers of the collectives a CUDA graph captures (NCCL_GRAPH_REGISTER, on by default).
# With the caching allocator's expandable segments (cuMem-mapped memory, run.use_expandable_segments) TSP's
# rings of weight shards (send/recv between neighbours) hung on the graph's replay: both ranks waiting in
# the GPU on two H200s, dense-7b 2 layers at 4K whole or layers alone, where the same steps replayed with
# either off (benchmarks/results/s24-h200x2-tsp-graph/). On four H200s tp=2,sp=2 hung the same way (dense-7b 2
# layers at 4K, twice; it replayed with registration off, 14.7 ms a step, and at 16K), where tp=4 and sp=4 replay
# with it on; off, they ran 2.6% slower on another lease (benchmarks/results/s26-h200x4-execute/). `meshplan
# execute` turns registration off before NCCL starts (worker.py) for TSP and for steps whose collectives run over
# more than one mesh axis; limits refuses the capture where it is still on (gpu_validation.py leaves it on, as its
# grids were measured: those layouts run eagerly there unless the caller sets it off).
RING_NCCL_ENV = {"NCCL_GRAPH_REGISTER": "0"}


def registration_hangs(layout: Layout) -> bool:
    """Whether a captured step of this layout hung on replay while NCCL registered its buffers in expandable
    segments: TSP's rings, and collectives over two or more mesh axes (tp=2,sp=2); one axis replays."""
    axes = sum(n > 1 for n in (layout.dp, layout.tp, layout.sp, layout.tpssm, layout.tsp))
    return layout.tsp > 1 or axes > 1


def ring_env(layout: Layout) -> dict:
    """The NCCL settings a step needs to be captured where registration hangs it (RING_NCCL_ENV); none for the
    layouts that replay with it."""
    return dict(RING_NCCL_ENV) if registration_hangs(layout) else {}


def expandable_segments(env=None) -> bool:
    """Whether the caching allocator's settings (PYTORCH_CUDA_ALLOC_CONF, else torch ≥ 2.9's
    PYTORCH_ALLOC_CONF) turn on expandable segments."""
    env = os.environ if env is None else env
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF") or env.get("PYTORCH_ALLOC_CONF") or ""
    settings = dict(item.partition(":")[::2] for item in conf.split(","))
    return {k.strip().lower(): v.strip().lower() for k, v in settings.items()}.get("expandable_segments") == "true"


def registers_ring_buffers(env=None) -> bool:
    """Whether NCCL would register a captured ring's buffers in expandable segments (the hang above)."""
    env = os.environ if env is None else env
    return expandable_segments(env) and env.get("NCCL_GRAPH_REGISTER", "1").strip() != "0"


def worker_env(layout: Layout, env=None) -> dict:
    """The environment `meshplan execute`'s workers capture under (worker.py puts it in place before NCCL
    starts; the CLI judges a capture by it): the caller's, with ring_env's settings where the caller has none."""
    env = dict(os.environ if env is None else env)
    for key, value in ring_env(layout).items():
        env.setdefault(key, value)
    return env


class CaptureFailed(RuntimeError):
    """A step asked to be captured could not be: one line naming why and the way out."""


def limits(
    layout: Layout, model: ModelSpec, mode: str, device: str, int8_allreduce: bool = False, env=None
) -> str | None:
    """Why a step of `model` under `layout` is not captured as a CUDA graph; None when it is. `env`: the
    environment the step runs in (this process's by default; the CLI passes its workers', worker_env)."""
    if not device.startswith("cuda"):
        return "device: CUDA graphs need a GPU"
    if mode != "train":
        return f"mode: only training steps are captured, not {mode}"
    if layout.pp > 1:
        return f"layout: pipeline stages (pp={layout.pp}) meet on the host's schedule; drop pp to capture the step"
    if layout.zero and layout.dp > 1:
        return f"layout: ZeRO {layout.zero}'s gathers land through the host's bookkeeping; execute zero=0 to capture"
    if int8_allreduce:
        return "int8_allreduce: the peer all-reduce meets at host barriers; execute without it to capture"
    if model.moe is not None:
        return f"model: {model.name}'s experts read their all-to-all split sizes on the host every layer"
    if model.family == "hybrid":
        # Zamba2-7B's first 6 layers on one H200 (session 21): the capture was invalidated
        # (cudaErrorStreamCaptureInvalidated), its first failing operation not found
        return f"model: {model.name}'s hybrid step did not capture on an H200 (capture invalidated); it runs eagerly"
    if registration_hangs(layout) and registers_ring_buffers(env):
        what = f"TSP's ring (tsp={layout.tsp})" if layout.tsp > 1 else f"{layout}'s collectives over several axes"
        return (
            f"layout: {what} hangs a replay while NCCL registers graph buffers in expandable"
            " segments; set NCCL_GRAPH_REGISTER=0 before the process group starts (meshplan execute does)"
        )
    return None


def capture(body, warm, warmups: int = 1, ready=None):
    """`warm` (a whole eager step) run `warmups` times on a side stream, as torch's whole-network capture
    asks (libraries set up their workspaces there), then `body` (the step's device work) captured on that
    stream; returns the torch.cuda.CUDAGraph to replay. Before the capture the cuBLAS workspaces (one set a
    stream: the eager steps' and the warm-up's) and the caching allocator's free blocks are released, and
    the peak memory statistic is reset: the capture allocates one set, in the graph's pool, and its peak is
    the step's. `ready()`: called between the warm-up and the capture (the mesh's byte counters reset there
    count the captured step alone)."""
    import torch

    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            warm()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
        torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    if ready is not None:
        ready()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=side):
            body()
    except RuntimeError as exc:  # torch's AcceleratorError is one
        graph.reset()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CaptureFailed(f"cuda_graph: the step did not capture ({first}); rerun with --no-cuda-graph") from exc
    torch.cuda.synchronize()
    return graph

"""JSON-ready records that the CLI renders: pure functions over the cost model, no I/O."""

from __future__ import annotations

import re

from meshplan.costmodel.memory import memory_per_gpu
from meshplan.costmodel.options import MemoryOptions
from meshplan.costmodel.runtime import fits_device, outside_allocator
from meshplan.errors import MeshplanError
from meshplan.layout import Layout, validate_layout
from meshplan.models import ModelSpec
from meshplan.topologies.cluster import ClusterSpec

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_tokens(text: str, field: str = "--seq") -> int:
    """'131072', '128k', '128K', '1m' → tokens (k = 1024, m = 1024²)."""
    match = _SIZE.match(str(text))
    if not match:
        raise MeshplanError(f"{field}: {text!r} is not a token count; write e.g. 4096, 16k or 1m")
    value = float(match.group(1)) * {"": 1, "k": 1024, "m": 1024**2}[match.group(2).lower()]
    if value != int(value) or value < 1:
        raise MeshplanError(f"{field}: {text!r} is not a positive whole number of tokens")
    return int(value)


def parse_token_list(text: str, field: str = "--sweep-seq") -> list[int]:
    return [parse_tokens(part, field) for part in text.split(",") if part.strip()]


def memory_record(
    model: ModelSpec, layout: Layout, seq: int, batch: int, opts: MemoryOptions, cluster: ClusterSpec | None = None
) -> dict:
    if cluster is not None:
        validate_layout(layout, model, cluster.num_gpus, cluster.name)
    result = memory_per_gpu(model, layout, seq, batch, opts)
    record = {
        "model": model.name,
        "layout": str(layout),
        "seq": seq,
        "batch": batch,
        "mode": opts.mode,
        "per_gpu_bytes": result.per_gpu_bytes,
        "at_peak_bytes": result.at_peak_bytes,
        "total_bytes": result.total_bytes,
        "peak_phase": result.peak_phase,
        "pipeline_stage": result.pipeline_stage,
        "assumptions": result.assumptions,
    }
    if cluster is not None:
        record["cluster"] = cluster.name
        record["gpu_memory_bytes"] = cluster.gpu.memory_bytes
        outside = outside_allocator(model, layout, seq, opts, cluster.gpus_per_node)
        record["outside_allocator_bytes"] = outside.total_bytes
        record["fits"] = fits_device(result.total_bytes, outside, cluster.gpu.memory_bytes)
    return record


def memory_records(
    model: ModelSpec,
    layouts: list[Layout],
    seqs: list[int],
    batch: int,
    opts: MemoryOptions,
    cluster: ClusterSpec | None = None,
) -> list[dict]:
    return [memory_record(model, layout, seq, batch, opts, cluster) for layout in layouts for seq in seqs]

"""What one run under torchrun is, as one frozen record: `meshplan execute` (RunSpec) and `meshplan
calibrate` (CalibrationSpec) build it once, write it to a JSON file, and hand its path to every worker
(meshplan.executor.worker, meshplan.executor.calibrate_run), which reads it back — no command-line
text for the worker to parse again. Torch-free: the CLI builds it without importing torch.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields


class _Record:
    """A frozen dataclass written to and read from a JSON file of its fields."""

    def write(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(asdict(self), f, indent=1)

    @classmethod
    def read(cls, path: str):
        with open(path) as f:
            data = json.load(f)
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"{path}: {cls.__name__} has no field(s) {', '.join(sorted(unknown))}")
        return cls(**data)


@dataclass(frozen=True)
class RunSpec(_Record):
    """One `meshplan execute`, as the CLI checked it."""

    model: str  # a preset name or a config.json path, as --model gave it
    layout: str
    seq: int  # tokens a sequence
    out: str  # the run file rank 0 writes
    batch: int = 1
    mode: str = "train"  # train | prefill | decode
    device: str = "cpu"  # cpu (gloo) | cuda (NCCL)
    dtype: str = ""  # bf16 on cuda, fp32 on cpu when empty
    steps: int = 5
    cluster: str = ""  # whose GPU and links the time prediction assumes ("": the preset of the GPU the run is on)
    timeout: float = 300.0  # seconds before a collective gives up
    layers: int = 0  # only the first this many layers (0: all)
    layers_only: bool = False  # the layer stack on random hidden states: no embedding, head or loss
    tokens: str | None = None  # .npy or .npz of token ids (the whole model; synthetic when None)
    weights: str | None = None  # a HF safetensors checkpoint folder, each rank reading its shard
    profile: bool = False  # GPU time by kernel category (one extra step)
    int8_allreduce: bool = False  # TP-SSM's block all-reduce in int8
    cuda_graph: bool | None = None  # the step captured and replayed (executor.graphs; None: where it can be)


@dataclass(frozen=True)
class CalibrationSpec(_Record):
    """One `meshplan calibrate`."""

    out: str  # the profile rank 0 writes
    cluster: str = "h200-8"  # the preset the profile extends
    quick: bool = False  # fewer sizes and repeats
    device: str = "cuda"  # cuda (NCCL) | cpu (gloo: collectives only)
    max_bytes: int = 0  # the largest message (0: 1 GiB, 256 MiB quick)


@contextmanager
def spec_file(spec: _Record):
    """The path of a temporary JSON file holding `spec`, removed when the run is over."""
    fd, path = tempfile.mkstemp(prefix="meshplan-run-", suffix=".json")
    os.close(fd)
    try:
        spec.write(path)
        yield path
    finally:
        os.unlink(path)

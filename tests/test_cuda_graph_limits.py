"""Which steps the executor captures as a CUDA graph (meshplan.executor.graphs.limits): training steps
without pipeline stages, ZeRO, experts or the int8 all-reduce; everything else says why not in one line,
naming the field."""

from types import SimpleNamespace

import pytest

from meshplan.executor import graphs
from meshplan.layout import parse_layout
from meshplan.models import PRESETS


@pytest.mark.parametrize("layout", ["tp=1", "tp=2", "sp=2", "dp=2", "dp=2,tp=2"])
def test_dense_training_steps_are_captured(layout):
    assert graphs.limits(parse_layout(layout), PRESETS["dense-7b"], "train", "cuda:0") is None


@pytest.mark.parametrize("layout", ["tp=1", "sp=2", "dp=2", "tpssm=2", "tp=2"])
def test_mamba2_training_steps_are_captured(layout):
    assert graphs.limits(parse_layout(layout), PRESETS["mamba2-130m"], "train", "cuda:0") is None


@pytest.mark.parametrize(
    "layout, model, mode, device, field",
    [
        ("tp=1", "dense-7b", "train", "cpu", "device"),
        ("tp=1", "dense-7b", "decode", "cuda:0", "mode"),
        ("tp=1", "dense-7b", "prefill", "cuda:0", "mode"),
        ("pp=2", "dense-7b", "train", "cuda:0", "layout"),
        ("dp=2,zero=1", "dense-7b", "train", "cuda:0", "layout"),
        ("tp=1", "zamba2-7b", "train", "cuda:0", "model"),
        ("tp=1", "mixtral-8x7b", "train", "cuda:0", "model"),
    ],
)
def test_other_steps_say_why_not(layout, model, mode, device, field):
    reason = graphs.limits(parse_layout(layout), PRESETS[model], mode, device)
    assert reason is not None and reason.startswith(f"{field}: ") and "\n" not in reason


@pytest.mark.parametrize("model", ["dense-7b", "mamba2-130m"])
def test_tsp_is_captured_only_where_nccl_leaves_the_rings_buffers_unregistered(monkeypatch, model):
    """TSP's send/recv rings hung a graph's replay while NCCL registered the captured buffers in expandable
    segments (benchmarks/results/s24-h200x2-tsp-graph/): refused in one line there, captured with either off."""
    tsp = parse_layout("tsp=2")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.delenv("NCCL_GRAPH_REGISTER", raising=False)
    reason = graphs.limits(tsp, PRESETS[model], "train", "cuda:0")
    assert reason is not None and reason.startswith("layout: ") and "NCCL_GRAPH_REGISTER=0" in reason
    assert "\n" not in reason
    monkeypatch.setenv("NCCL_GRAPH_REGISTER", "0")
    assert graphs.limits(tsp, PRESETS[model], "train", "cuda:0") is None
    monkeypatch.delenv("NCCL_GRAPH_REGISTER")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    assert graphs.limits(tsp, PRESETS[model], "train", "cuda:0") is None


@pytest.mark.parametrize(
    "conf, expandable",
    [
        ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128, Expandable_Segments : True"}, True),
        ({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, True),  # torch ≥ 2.9's name
        (
            {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False", "PYTORCH_ALLOC_CONF": "expandable_segments:True"},
            False,
        ),
        ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}, False),
        ({}, False),
    ],
)
def test_the_allocator_settings_are_read_as_torch_reads_them(conf, expandable):
    assert graphs.expandable_segments(conf) is expandable
    assert graphs.registers_ring_buffers({**conf, "NCCL_GRAPH_REGISTER": " 0 "}) is False
    assert graphs.registers_ring_buffers(conf) is expandable


def test_the_cli_judges_a_tsp_capture_in_its_workers_environment(monkeypatch):
    """`meshplan execute --cuda-graph --layout tsp=2` with expandable segments exported: the workers turn
    registration off before NCCL starts, so the CLI's check (made before any worker runs) passes; a
    user's own NCCL_GRAPH_REGISTER=1 is kept, and refused in one line."""
    tsp = parse_layout("tsp=2")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.delenv("NCCL_GRAPH_REGISTER", raising=False)
    model = PRESETS["dense-7b"]
    assert graphs.limits(tsp, model, "train", "cuda:0", env=graphs.worker_env(tsp)) is None
    monkeypatch.setenv("NCCL_GRAPH_REGISTER", "1")
    reason = graphs.limits(tsp, model, "train", "cuda:0", env=graphs.worker_env(tsp))
    assert reason is not None and reason.startswith("layout: ")


def test_execute_turns_registration_off_where_it_hangs_a_replay():
    """TSP's rings and collectives over two or more mesh axes (tp=2,sp=2 hung on four H200s) capture with
    registration off; a single tensor, sequence or data axis keeps it (those replayed with it)."""
    for hangs in ("tsp=2", "dp=2,tsp=2", "tp=2,sp=2", "dp=2,tp=2"):
        assert graphs.ring_env(parse_layout(hangs)) == {"NCCL_GRAPH_REGISTER": "0"}, hangs
    for other in ("tp=2", "sp=2", "dp=2", "tpssm=2", "tp=4", "sp=4"):
        assert graphs.ring_env(parse_layout(other)) == {}
    reason = graphs.limits(
        parse_layout("tp=2,sp=2"),
        PRESETS["dense-7b"],
        "train",
        "cuda:0",
        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    )
    assert reason is not None and "collectives over several axes" in reason
    assert not graphs.registers_ring_buffers(
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", **graphs.ring_env(parse_layout("tsp=2"))}
    )


def test_int8_allreduce_is_not_captured():
    reason = graphs.limits(parse_layout("tpssm=2"), PRESETS["mamba2-130m"], "train", "cuda:0", int8_allreduce=True)
    assert reason is not None and reason.startswith("int8_allreduce: ")


class _Optimizer:
    """Stands in for MixedAdam: whether its bias corrections are on the device, and why not."""

    def __init__(self, why=None):
        self.scalars, self.why = None, why

    def on_device_scalars(self):
        if self.why is None:
            self.scalars = "on the device"
        return self.why


def test_a_capture_puts_the_optimizers_scalars_on_the_device_first(monkeypatch):
    """A graph that captured Adam with its bias corrections as host constants would replay the capture's
    step every time (session 22's probe did so and read the drift as a graph-vs-eager gap): `_graphed`
    moves them to the device before it captures, or refuses in one line."""
    from meshplan.executor import run

    seen = []
    monkeypatch.setattr(graphs, "capture", lambda body, warm, ready=None: seen.append(opt.scalars))
    opt = _Optimizer()
    mesh = SimpleNamespace(counts={}, calls={}, reset_counts=lambda: None)
    run._graphed([], None, None, None, opt, None, None, 1, mesh)
    assert seen == ["on the device"]

    with pytest.raises(graphs.CaptureFailed, match=r"^cuda_graph: .*optimizer: kept on the host\)$"):
        run._graphed([], None, None, None, _Optimizer("optimizer: kept on the host"), None, None, 1, mesh=None)


def test_a_cpu_optimizer_is_refused_before_any_capture():
    import torch

    from meshplan.executor import run
    from meshplan.executor.optim import MixedAdam

    opt = MixedAdam([torch.nn.Parameter(torch.zeros(4, 4))])
    with pytest.raises(graphs.CaptureFailed, match="stepped by torch's AdamW"):
        run._graphed([], None, None, None, opt, None, None, 1, mesh=None)

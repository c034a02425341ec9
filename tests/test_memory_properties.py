"""Invariants of the memory model over random models, layouts and shapes (hypothesis)."""

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from meshplan.costmodel.memory import memory_per_gpu
from meshplan.costmodel.options import MemoryOptions
from meshplan.errors import MeshplanError
from meshplan.layout import Layout, validate_layout
from meshplan.models import PRESETS

MODELS = ["dense-7b", "llama3-8b", "mamba2-1.3b", "falcon-mamba-7b", "zamba2-7b"]
DENSE = ["dense-7b", "llama3-8b"]
degrees = st.sampled_from([1, 2, 4, 8])
seqs = st.integers(1, 512).map(lambda k: 256 * k)


@st.composite
def layouts(draw):
    kind = draw(st.sampled_from(["tp", "sp", "tpsp", "tsp", "tpssm"]))
    d = draw(degrees)
    extra = dict(dp=draw(st.sampled_from([1, 2])), pp=draw(st.sampled_from([1, 2])), zero=draw(st.integers(0, 3)))
    return {
        "tp": Layout(tp=d, **extra),
        "sp": Layout(sp=d, **extra),
        "tsp": Layout(tsp=d, **extra),
        "tpsp": Layout(tp=d, sp=draw(degrees), **extra),
        "tpssm": Layout(tpssm=d, **extra),
    }[kind]


def run(model, layout, seq, batch, opts):
    try:
        return memory_per_gpu(PRESETS[model], layout, seq, batch, opts)
    except MeshplanError:
        assume(False)


options = st.builds(
    MemoryOptions,
    mode=st.sampled_from(["train", "prefill", "decode"]),
    recompute=st.sampled_from(["none", "selective", "full"]),
    flash_attention=st.booleans(),
    tp_sequence_parallel=st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(MODELS), layouts(), seqs, st.integers(1, 8), options)
def test_never_negative_and_total_covers_persistent(model, layout, seq, batch, opts):
    r = run(model, layout, seq, batch, opts)
    assert all(v >= 0 for v in r.per_gpu_bytes.values())
    b = r.per_gpu_bytes
    # Gradients are rebuilt during backward (set to None between steps): they need not coexist with
    # all activations, but every kept term and the larger of the two must fit under the total.
    kept = b["parameters"] + b["optimizer_state"] + b["kv_cache"] + b["ssm_state_cache"]
    assert r.total_bytes >= kept + max(b["activations"], b["gradients"])
    # What is held at the peak moment (the plot's stacked bars): the kept terms whole, activations and
    # gradients at most their largest, none negative, and together the total.
    at = r.at_peak_bytes
    assert sum(at.values()) == r.total_bytes and min(at.values()) >= 0
    for key in ("parameters", "optimizer_state", "kv_cache", "ssm_state_cache"):
        assert at[key] == b[key]
    slack = len(at)  # whole bytes: each component's rounding is half a byte at most
    assert at["activations"] <= b["activations"] + slack and at["gradients"] <= b["gradients"] + slack


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(MODELS), layouts(), seqs, st.integers(1, 8), options)
def test_monotone_in_seq_and_batch(model, layout, seq, batch, opts):
    base = run(model, layout, seq, batch, opts)
    assert run(model, layout, 2 * seq, batch, opts).total_bytes >= base.total_bytes
    assert run(model, layout, seq, batch + 1, opts).total_bytes >= base.total_bytes


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(DENSE), degrees, seqs, st.integers(1, 4), options, st.sampled_from([1, 2]))
def test_tsp_weights_equal_tp_and_tsp_activations_equal_sp(model, d, seq, batch, opts, dp):
    tsp = run(model, Layout(tsp=d, dp=dp), seq, batch, opts)
    tp = run(model, Layout(tp=d, dp=dp), seq, batch, opts)
    sp = run(model, Layout(sp=d, dp=dp), seq, batch, opts)
    for key in ("parameters", "gradients", "optimizer_state"):
        assert tsp.per_gpu_bytes[key] == tp.per_gpu_bytes[key]
    for key in ("activations", "kv_cache", "transient_kv_gather"):
        assert tsp.per_gpu_bytes[key] == sp.per_gpu_bytes[key]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(MODELS), st.integers(1, 64), st.sampled_from(["tp", "tsp", "tpssm"]))
def test_valid_degrees_are_exactly_the_common_divisors(model_name, degree, axis):
    model = PRESETS[model_name]
    if axis == "tpssm" and not model.has_mamba:
        return
    counts = []
    if model.attention:
        counts += [model.attention.heads, model.attention.kv_heads]
    if model.mlp:
        counts.append(model.mlp.ffn_hidden)
    if model.mamba2:
        counts.append(model.mamba2.nheads)
    if model.mamba1:
        counts.append(model.mamba1.d_inner)
    divides = all(c % degree == 0 for c in counts)
    if model.mamba2 and axis != "tsp":
        g = model.mamba2.ngroups
        divides = divides and (g % degree == 0 or degree % g == 0)
    try:
        validate_layout(Layout(**{axis: degree}), model)
        accepted = True
    except MeshplanError:
        accepted = False
    assert accepted == divides


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(DENSE), degrees, seqs)
def test_weight_sharding_divides_model_states_exactly(model, d, seq):
    spec = PRESETS[model]
    p, norms = spec.param_count(), spec.norm_params()
    r = run(model, Layout(tp=d), seq, 1, MemoryOptions())
    split = r.per_gpu_bytes["parameters"] - (norms * 2 if d > 1 else 0)  # norm scales stay whole
    assert split * d == (p - (norms if d > 1 else 0)) * 2
    assert r.per_gpu_bytes["optimizer_state"] == 6 * r.per_gpu_bytes["parameters"]

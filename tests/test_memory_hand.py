"""Hand-computed memory cases: the arithmetic is written out here, independent of the model code."""

from dataclasses import replace

import pytest

from meshplan.costmodel.memory import memory_per_gpu, saved_activation_bytes
from meshplan.costmodel.options import MemoryOptions
from meshplan.layout import Layout, parse_layout
from meshplan.models import PRESETS, dense

# Korthikanti et al. 2022's setting: LayerNorm, GeLU MLP with F = 4, MHA, dropout, no fused attention.
H, A, S, B = 1024, 16, 512, 2
KORTHIKANTI = replace(dense("korthikanti", H, 1, A, A, 4 * H, 1000, gated=False), norm="layernorm")
PAPER = MemoryOptions(dropout=True, flash_attention=False, act_dtype="bf16")
LN_STATS = 2 * 8  # two LayerNorms, each keeping fp32 mean and rstd per token


def acts(layout: str, opts: MemoryOptions = PAPER, model=KORTHIKANTI) -> float:
    return saved_activation_bytes(model, parse_layout(layout), S, B, opts)[0]


def test_no_parallelism_is_34_plus_5as_over_h():
    sbh = S * B * H
    assert acts("single") == sbh * 34 + 5 * A * S * S * B + LN_STATS * S * B


def test_tp_without_sequence_parallel_is_10_plus_24_over_t():
    t = 4
    sbh = S * B * H
    assert acts(f"tp={t}") == sbh * (10 + 24 / t) + 5 * A * S * S * B / t + LN_STATS * S * B


def test_tp_with_megatron_sp_is_34_over_t():
    t = 4
    sbh = S * B * H
    expected = sbh * 34 / t + 5 * A * S * S * B / t + LN_STATS * S * B / t
    assert acts(f"tp={t}", replace(PAPER, tp_sequence_parallel=True)) == pytest.approx(expected)


def test_selective_recompute_drops_the_score_term():
    assert acts("single", replace(PAPER, recompute="selective")) == S * B * H * 34 + LN_STATS * S * B


def test_flash_attention_keeps_output_and_logsumexp_not_scores():
    # Without scores: 34·sbh still (the attention output is the out-projection input), + fp32 lse per head.
    assert acts("single", replace(PAPER, flash_attention=True)) == S * B * H * 34 + LN_STATS * S * B + 4 * A * S * B


def test_full_recompute_keeps_each_layer_input():
    assert acts("single", replace(PAPER, recompute="full")) == 2 * S * B * H


def test_gated_mlp_without_dropout_is_40_sbh_with_rmsnorm():
    # Our executor's dense layer: SwiGLU (its input [gate; up] and the product — silu(gate) is recomputed
    # in backward, experts.SwiGLUFn: 3·F·sbh·2 bytes = 24 sbh at F = 4), MLP input 2, QKV input 2, Q K V 6,
    # attention output 2, norm inputs 4 → 40·sbh; + rstd 2·4 B and lse.
    model = dense("ours", H, 1, A, A, 4 * H, 1000)
    got = acts("single", MemoryOptions(), model)
    assert got == 40 * S * B * H + 2 * 4 * S * B + 4 * A * S * B


def test_model_states_dense_7b_tp8():
    # dense-7b: per layer 4h² (attention) + 3·4h·h (gated MLP) + 2h (norms) = 16·4096² + 8192 = 268,443,648;
    # ×32 = 8,590,196,736; + embedding and head 2·32000·4096 + final norm 4096 = 262,148,096.
    params = 8_852_344_832
    assert PRESETS["dense-7b"].param_count() == params
    # Norm scales stay whole on every TP rank: 32 layers · 2 · 4096 + the final 4096 = 266,240.
    norms = 266_240
    local = (params - norms) // 8 + norms
    r = memory_per_gpu(PRESETS["dense-7b"], parse_layout("tp=8"), 4096, 1)
    assert r.per_gpu_bytes["parameters"] == local * 2
    assert r.per_gpu_bytes["gradients"] == local * 2
    assert r.per_gpu_bytes["optimizer_state"] == local * 12  # 16 B/param in all


def test_fp32_gradients_make_18_bytes_per_param():
    model = PRESETS["llama3-8b"]
    r = memory_per_gpu(model, Layout(), 1024, 1, MemoryOptions(grad_dtype="fp32"))
    states = r.per_gpu_bytes["parameters"] + r.per_gpu_bytes["gradients"] + r.per_gpu_bytes["optimizer_state"]
    assert states == 18 * model.param_count()


@pytest.mark.parametrize("zero, div", [(0, (1, 1, 1)), (1, (1, 1, 4)), (2, (1, 4, 4)), (3, (4, 4, 4))])
def test_zero_stages_divide_by_dp(zero, div):
    model = PRESETS["llama3-8b"]
    norms = 32 * 2 * 4096 + 4096
    p = (model.param_count() - norms) / 2 + norms  # tp=2, norm scales whole
    r = memory_per_gpu(model, Layout(dp=4, tp=2, zero=zero), 1024, 1)
    assert r.per_gpu_bytes["parameters"] == round(p * 2 / div[0])
    assert r.per_gpu_bytes["gradients"] == round(p * 2 / div[1])
    assert r.per_gpu_bytes["optimizer_state"] == round(p * 12 / div[2])


def test_kv_cache_llama3_8b_decode():
    # 2 (K and V) · 32 layers · 8192 tokens · 8 KV heads · 128 · 2 bytes = 1 GiB per sequence.
    model = PRESETS["llama3-8b"]
    opts = MemoryOptions(mode="decode")
    assert memory_per_gpu(model, Layout(), 8192, 1, opts).per_gpu_bytes["kv_cache"] == 2 * 32 * 8192 * 1024 * 2
    assert memory_per_gpu(model, Layout(tp=8), 8192, 1, opts).per_gpu_bytes["kv_cache"] == 2 * 32 * 8192 * 128 * 2
    assert memory_per_gpu(model, Layout(sp=4), 8192, 1, opts).per_gpu_bytes["kv_cache"] == 2 * 32 * 2048 * 1024 * 2


def test_ssm_state_cache_mamba2_130m():
    # Per layer and sequence: conv state (1536 + 2·128) channels · 3 taps · 2 B = 10,752;
    # SSM state 24 heads · 64 · 128 · 4 B (fp32) = 786,432. 24 layers.
    model = PRESETS["mamba2-130m"]
    r = memory_per_gpu(model, Layout(), 4096, 1, MemoryOptions(mode="decode"))
    assert r.per_gpu_bytes["ssm_state_cache"] == 24 * (10_752 + 786_432)
    assert r.per_gpu_bytes["kv_cache"] == 0
    # TP-SSM over 2: x channels and heads split, B/C (ngroups = 1) replicated on both ranks.
    r2 = memory_per_gpu(model, Layout(tpssm=2), 4096, 1, MemoryOptions(mode="decode"))
    assert r2.per_gpu_bytes["ssm_state_cache"] == 24 * ((768 + 256) * 3 * 2 + 12 * 64 * 128 * 4)


def test_logits_at_128k_are_design_md_16_8_gb_and_the_gemms_bf16_copy():
    # docs/design.md §3: b·s·V fp32 logits at 128K tokens, V = 32000: 16.8 GB, which the loss keeps (as its
    # exponentials); beside them, at the peak, the head GEMM's bf16 logits (measured on one H200:
    # benchmarks/results/memory-peak-whole-dense-7b-2L-131072-h200.json). Unsplit without TP.
    model = PRESETS["dense-7b"]
    r = memory_per_gpu(model, Layout(), 131072, 1)
    assert r.per_gpu_bytes["transient_logits"] == 131072 * 32000 * (4 + 2)
    assert 131072 * 32000 * 4 == pytest.approx(16.8e9, rel=0.01)
    tp = memory_per_gpu(model, Layout(tp=8), 131072, 1)  # vocab-parallel loss
    assert tp.per_gpu_bytes["transient_logits"] == 131072 * 4000 * (4 + 2)
    # TSP's head sums its column shards in fp32: two fp32 copies of the rank's 1/8 of the tokens' logits
    # (memory-peak-mamba2-130m-tsp2-sp2-h200x2.json) in forward, beside the ring's two shards; in backward
    # the loss's fp32 exponentials, the logits' bf16 gradient and the partial gradient of the whole head:
    # the larger of the two.
    tsp = memory_per_gpu(model, Layout(tsp=8), 131072, 1)
    matrix = 32000 * 4096
    logits = 131072 / 8 * 32000
    forward, backward = logits * (4 + 4), logits * (4 + 2) + matrix * 2
    assert tsp.per_gpu_bytes["transient_logits"] == pytest.approx(max(forward, backward) + 2 * matrix / 8 * 2)
    # At 4K tokens on 2 ranks the head's gradient outweighs the fp32 copy it replaces: the backward holds more.
    small = memory_per_gpu(model, Layout(tsp=2), 4096, 1)
    logits = 4096 / 2 * 32000
    forward, backward = logits * (4 + 4), logits * (4 + 2) + matrix * 2
    assert backward > forward
    assert small.per_gpu_bytes["transient_logits"] == pytest.approx(backward + 2 * matrix / 2 * 2)


def test_tsp_in_flight_shards():
    model = PRESETS["dense-7b"]
    mlp_params = 3 * 4096 * 16384  # the largest block: gate, up, down (the norm's scale is not streamed)
    # The rank's own packed shard, the shard in use and the one arriving, in bf16.
    r = memory_per_gpu(model, Layout(tsp=8), 16384, 1, MemoryOptions(mode="prefill"))
    assert r.per_gpu_bytes["transient_weight_shards"] == round(3 * mlp_params / 8 * 2)
    # Training also holds the partial gradients of all 8 shards until their reduce-scatter, each hop's
    # written into its row (the backward's ring holds three shards, as the forward's).
    t = memory_per_gpu(model, Layout(tsp=8), 16384, 1, MemoryOptions())
    assert t.per_gpu_bytes["transient_weight_shards"] == round(3 * mlp_params / 8 * 2 + mlp_params * 2)
    # K/V of the whole sequence for one layer: 2 · 16384 · 4096 · 2 B.
    assert r.per_gpu_bytes["transient_kv_gather"] == 2 * 16384 * 4096 * 2


def test_pipeline_first_stage_holds_pp_microbatches():
    model = PRESETS["dense-7b"]
    one = memory_per_gpu(model, Layout(tp=8), 4096, 1)
    pp = memory_per_gpu(model, Layout(tp=8, pp=4), 4096, 1)
    # 1F1B: the first stage keeps 4 micro-batches of its 8 layers = the same 32 layers' worth, plus
    # the stage's output of each of the 4 and the gradient coming back (4096 · 4096 bf16 each).
    assert pp.pipeline_stage == "first"
    assert (
        pp.per_gpu_bytes["activations"]
        == one.per_gpu_bytes["activations"] - round(saved_head_bytes(model, 4096)) + 5 * 4096 * 4096 * 2
    )


def saved_head_bytes(model, seq):
    # final norm input + LM head input (bf16, full width) + fp32 rstd, unsplit by TP: 2·2·h + 4 per token;
    # the loss's fp32 sum of exponentials, int64 target column and bool "in this rank's vocabulary": 13;
    # the embedding's int64 ids: 8.
    return seq * (2 * 2 * model.d_model + 4 + 13 + 8)


@pytest.mark.parametrize(
    "layout, want",
    [
        # d_inner 5120, 80 heads of 64, d_state 128, 1 group, 16384 tokens, bf16: the scan phase wins.
        # Single GPU: 16384 · ((5120 + 256) · 2 + 80 · 4)   conv output, dt
        #           + 16384 · 5120 · 2 · 2                  the scan's dy, and dz waiting for the in_proj gradient
        #           + (256 chunks · 80 · 64 · 128) · (2 + 2)  the entering states and dS (bf16)
        #           + 256 · 80 · 64² · 2                    the C·B gradient (bf16)
        #           + 16384 · (5120 · 2 + 80 · 4 + 2 · 128 · 4 · 4)  dx, ddt, fp32 dB/dC for 4 head splits
        ("single", 16384 * (11072 + 2 * 10240 + 14656) + 256 * 80 * 64 * 128 * 4 + 256 * 80 * 64**2 * 2),
        # TP-SSM 2: heads halved, the single B/C group kept whole on both ranks (40 heads: 4 splits).
        (
            "tpssm=2",
            16384 * ((2560 + 256) * 2 + 160 + 2 * 2560 * 2 + (2560 * 2 + 160 + 4096))
            + 256 * 40 * 64 * 128 * 4
            + 256 * 40 * 64**2 * 2,
        ),
        # SP 2: 8192 tokens per shard, the single GPU's phases at half the tokens, but 8 head splits (128
        # chunks need 8 to reach 1024 programs); one scan backward a shard: its correction's C·E and
        # corrected output live in the gated-norm phase, which stays smaller, 8192 · (11072 + 7 · 10240).
        ("sp=2", 8192 * (11072 + 2 * 10240 + (10240 + 320 + 8192)) + 128 * 80 * 64 * 128 * 4 + 128 * 80 * 64**2 * 2),
    ],
)
def test_mamba2_backward_transient_is_the_scan_phase(layout, want):
    from meshplan.costmodel.axes import sharding_for
    from meshplan.costmodel.blocks.mamba2 import mixer_backward_bytes

    sh = sharding_for(parse_layout(layout), MemoryOptions())
    assert mixer_backward_bytes(PRESETS["mamba2-2.7b"], 16384, sh, 2) == want


def test_mamba2_prefill_transient_is_the_scan_phase():
    """mamba2-2.7b, 16384 tokens, bf16, one GPU: conv output (5120 + 256) and dt (80 fp32) per token,
    the entering states (256 chunks · 80 · 64 · 128, bf16) and the scan output (5120 per token)."""
    from meshplan.costmodel.axes import sharding_for
    from meshplan.costmodel.blocks.mamba2 import mixer_forward_bytes

    sh = sharding_for(parse_layout("single"), MemoryOptions())
    want = 16384 * ((5120 + 256) * 2 + 80 * 4 + 5120 * 2) + 256 * 80 * 64 * 128 * 2
    assert mixer_forward_bytes(PRESETS["mamba2-2.7b"], 16384, sh, 2) == want


def test_segmented_passing_keeps_segment_states_beside_the_chunk_states(monkeypatch):
    """With the passings in segments (a target of 512 programs): one GPU, one row of 16384 tokens at
    80 heads passes in 4 segments, whose entering states (bf16) and 256 chunks' fp32 decays from their
    segment's start sit beside the prefill's states; training holds them twice (both passings), once
    with the backward's passings whole; 4 rows of 4096 pass whole."""
    from meshplan.costmodel.axes import sharding_for
    from meshplan.costmodel.blocks.mamba2 import mixer_backward_bytes, mixer_forward_bytes
    from meshplan.kernels import launch

    model, sh = PRESETS["mamba2-2.7b"], sharding_for(parse_layout("single"), MemoryOptions())
    whole_fwd = mixer_forward_bytes(model, 16384, sh, 2)
    whole_bwd = mixer_backward_bytes(model, 16384, sh, 2)
    monkeypatch.setattr(launch, "PASS_PROGRAM_TARGET", 512)
    monkeypatch.setattr(launch, "PASS_SEGMENT_BELOW", 10**9)
    monkeypatch.setattr(launch, "PASS_SEGMENT_BACKWARD_BELOW", 10**9)
    join = 80 * (4 * 64 * 128 * 2 + 256 * 4)
    assert mixer_forward_bytes(model, 16384, sh, 2) == whole_fwd + join
    assert mixer_forward_bytes(model, 16384, sh, 2, rows=4) == whole_fwd
    assert mixer_backward_bytes(model, 16384, sh, 2) == whole_bwd + 2 * join
    monkeypatch.setattr(launch, "PASS_SEGMENT_BACKWARD_BELOW", 0)
    assert mixer_backward_bytes(model, 16384, sh, 2) == whole_bwd


def test_mamba2_prefill_transient_under_sp():
    """SP 2, 8192 tokens a shard: at the gated norm, the conv output and dt, the shard's zero-start
    scan output y0, the corrected output (the Triton correction writes nothing else of that width) and
    the norm's output — three of 8192 · 5120 bf16 — as many as the scan phase holds (y0 and 128 chunks'
    entering states, 2 · 8192 · 5120 bytes). With C·E a torch tensor and z copied, the norm phase held
    five (memory-peak-mamba2-prefill-sp2-h200.json)."""
    from meshplan.costmodel.axes import sharding_for
    from meshplan.costmodel.blocks.mamba2 import mixer_forward_bytes

    sh = sharding_for(parse_layout("sp=2"), MemoryOptions())
    want = 8192 * ((5120 + 256) * 2 + 80 * 4) + 3 * 8192 * 5120 * 2
    assert mixer_forward_bytes(PRESETS["mamba2-2.7b"], 16384, sh, 2) == want


def test_training_peak_at_attention_frees_the_layers_mlp_first():
    """SP training with K/V much wider than the MLP: the backward's peak is the last layer's attention,
    where the whole sequence's K, V and their gradients stand beside the layer's input, output and
    output gradient — after the MLP's saved tensors of that layer are freed."""
    from meshplan.costmodel.blocks import block_params

    model = dense("wide-kv", 1024, 2, 8, 8, 512, 1000)
    seq, local = 8192, 8192 // 4
    r = memory_per_gpu(model, Layout(sp=4), seq, 1, MemoryOptions(), embeddings=False)
    assert r.peak_phase == "attention"
    kv = 2 * seq * 1024 * 2 * 2  # K and V of the whole sequence in bf16, and their gradients
    boundary = 3 * local * 1024 * 2  # the layer's input, output and output gradient
    mlp_saved = local * (2 * 1024 * 2 + 4 + 3 * 512 * 2)  # norm input, rstd, w_in input; [gate; up], product
    p = r.per_gpu_bytes
    share = block_params(model, "attention") / model.layer_params()  # gradients that exist as backward starts
    kept = p["parameters"] + p["optimizer_state"] + p["blas_workspace"]
    assert r.total_bytes == pytest.approx(
        kept + p["activations"] + p["gradients"] * share + boundary + kv - mlp_saved, rel=1e-9
    )


def test_blas_workspace_one_handle_inference_two_training():
    """32 MiB per cuBLAS handle on Hopper; training's backward runs on the autograd thread's own handle."""
    model = PRESETS["dense-7b"]
    assert (
        memory_per_gpu(model, Layout(tp=8), 4096, 1, MemoryOptions(mode="prefill")).per_gpu_bytes["blas_workspace"]
        == 32 * 2**20
    )
    training = memory_per_gpu(model, Layout(tp=8), 4096, 1, MemoryOptions())
    assert training.per_gpu_bytes["blas_workspace"] == 64 * 2**20


def test_int8_peer_buffer_two_slots_of_the_block_output():
    """TP-SSM 2 with the int8 all-reduce holds two slots of 128 signal bytes and one packed row (1 byte
    an element, 4 per 128) of the block output, each rounded up to 2 MiB: mamba2-2.7b prefill of
    4 × 16K tokens, 65,536 × 2,560 = 167,772,160 elements → 128 + 167,772,160 + 5,242,880 =
    173,015,168 bytes → 83 × 2 MiB = 174,063,616 a slot. Degree 4 and bf16 hold none."""
    model = PRESETS["mamba2-2.7b"]
    int8 = MemoryOptions(mode="prefill", int8_allreduce=True)
    r = memory_per_gpu(model, Layout(tpssm=2), 16384, 4, int8)
    assert r.per_gpu_bytes["int8_peer_buffer"] == 2 * 174_063_616
    without = memory_per_gpu(model, Layout(tpssm=2), 16384, 4, MemoryOptions(mode="prefill"))
    assert r.total_bytes - without.total_bytes == 2 * 174_063_616
    assert memory_per_gpu(model, Layout(tpssm=4), 16384, 4, int8).per_gpu_bytes["int8_peer_buffer"] == 0
    assert without.per_gpu_bytes["int8_peer_buffer"] == 0


@pytest.mark.parametrize("zero, div", [(1, (1, 1, 8)), (2, (1, 8, 8)), (3, (8, 8, 8))])
def test_zero_shards_over_dp_and_sp_together(zero, div):
    # SP replicates the weights along Σ as DP does: ZeRO shards over the dp·sp ranks its reduce-scatter
    # spans (the schedule's gradient group), here 4 · 2.
    model = PRESETS["llama3-8b"]
    p = model.param_count()
    r = memory_per_gpu(model, Layout(dp=4, sp=2, zero=zero), 1024, 1)
    assert r.per_gpu_bytes["parameters"] == round(p * 2 / div[0])
    assert r.per_gpu_bytes["gradients"] == round(p * 2 / div[1])
    assert r.per_gpu_bytes["optimizer_state"] == round(p * 12 / div[2])


def test_query_key_norms_add_their_pass_over_q_and_k():
    """Qwen3's per-head query/key norms read and write q and k once more (forward), priced with the
    attention block's memory-bound bytes: on top of the pre-norm and residual (5·h) and the rotary
    (2·(q + kv) widths), 2·(q + kv) bf16 elements a token, split by the tensor degree as the heads are."""
    from dataclasses import replace

    from meshplan.costmodel.blocks import BLOCKS
    from meshplan.models import dense

    plain = dense("plain", 2048, 2, 16, 4, 6144, 32000)
    normed = replace(plain, attention=replace(plain.attention, qk_norm=2 * plain.attention.head_dim))
    h, qk = 2048, plain.attention.q_width + plain.attention.kv_width
    assert BLOCKS["attention"].memory_bound_bytes_per_token(plain, 1, 2) == 2 * (5 * h + 2 * qk)
    assert BLOCKS["attention"].memory_bound_bytes_per_token(normed, 1, 2) == 2 * (5 * h + 4 * qk)
    assert BLOCKS["attention"].memory_bound_bytes_per_token(normed, 2, 2) == 2 * (5 * h + 2 * qk)

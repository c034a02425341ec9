"""Real weights: HF safetensors checkpoints that transformers writes here (no network), read by the
single-process reference and, slice by slice, by every rank of a layout. The independent reference
is transformers' own model: its loss and next-token log-probabilities on the same ids.

transformers takes its norms and its loss in fp32 whatever the model's dtype, so the float64
comparisons with it agree to ~1e-7, not to float64's precision: the bound is 1e-5. A wrong rotary
convention or a misplaced slice moves the loss by more than 1e-2."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Mamba2Config,
    Mamba2ForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from typer.testing import CliRunner

from meshplan.cli import app
from meshplan.errors import MeshplanError
from meshplan.executor.check_model import check_model
from meshplan.executor.checkpoint import Checkpoint, load_into
from meshplan.executor.distributed import run_distributed
from meshplan.executor.model import CausalLM
from meshplan.executor.rotary import Rotary, inv_freq, rotate_qk
from meshplan.hf_config import load_model
from meshplan.layout import parse_layout
from meshplan.models import RopeSpec

VOCAB, SEQ, BATCH = 64, 16, 2
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def _perturb_norms(model):
    """Scales that are not all ones, so that a norm read from the wrong tensor shows."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _write(folder, model):
    torch.manual_seed(0)
    model = _perturb_norms(model.double())
    # Small shards: several files and an index, as large checkpoints are stored.
    model.save_pretrained(folder, max_shard_size="40KB")
    return model.eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    made = {
        "llama3": LlamaForCausalLM(LlamaConfig(**SHAPE, rms_norm_eps=1e-6, rope_parameters=LLAMA3_ROPE)),
        "phi3": Phi3ForCausalLM(Phi3Config(**SHAPE)),
        # each query and key head RMS-normed (self_attn.q_norm, k_norm) before the rotary
        "qwen3": Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=8)),
        "mamba2": Mamba2ForCausalLM(
            Mamba2Config(
                vocab_size=VOCAB,
                hidden_size=32,
                state_size=8,
                head_dim=8,
                num_heads=8,
                n_groups=1,
                expand=2,
                conv_kernel=4,
                num_hidden_layers=2,
                layer_norm_epsilon=1e-5,
                tie_word_embeddings=True,
                chunk_size=8,
            )
        ),
    }
    return {name: (str(root / name), _write(root / name, model)) for name, model in made.items()}


def _ids(seed=1):
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(seed))


def test_inv_freq_matches_transformers_llama3():
    cfg = LlamaConfig(**SHAPE, rope_parameters=LLAMA3_ROPE)
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    rope = RopeSpec(
        theta=1e4, kind="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=64
    )
    assert torch.equal(inv_freq(rope, 8), want)
    # The three bands are all present at this size: kept, blended, divided by the factor.
    plain = inv_freq(RopeSpec(theta=1e4), 8)
    ratio = (plain / want).tolist()
    assert (
        ratio[0] == 1.0 and 1.0 < ratio[1] < 8.0 and ratio[2] == pytest.approx(8.0) and ratio[3] == pytest.approx(8.0)
    )


def test_rotation_in_place_has_the_inverse_rotation_as_gradient():
    rotary = Rotary(RopeSpec(theta=100.0), 4)
    positions = torch.tensor([0, 3, 5])
    base = torch.randn(2, 3, 3 * 4 + 4, dtype=torch.float64, requires_grad=True)  # 2 q heads, 1 k, 1 v head

    def f(x):
        return rotate_qk(x * 1.0, rotary, positions, 8, 4, 4)

    assert torch.autograd.gradcheck(f, (base,))
    out = f(base).detach()
    assert torch.equal(out[..., 12:], base.detach()[..., 12:])  # v untouched
    # Rotations keep each pair's length; position 0 is not turned.
    assert torch.allclose(
        out[..., :12].reshape(2, 3, 3, 2, 2).pow(2).sum(-2),
        base.detach()[..., :12].reshape(2, 3, 3, 2, 2).pow(2).sum(-2),
    )
    assert torch.allclose(out[:, 0], base.detach()[:, 0])


@pytest.mark.parametrize("name", ["llama3", "phi3", "qwen3", "mamba2"])
def test_reference_reads_a_checkpoint_to_transformers_loss(checkpoints, name):
    folder, hf = checkpoints[name]
    spec = load_model(folder)
    ref = CausalLM(spec).double()
    read = load_into([ref], folder, spec)
    assert read == sum(p.numel() for p in ref.parameters()) * 8  # every value once, in float64
    ids = _ids()
    with torch.no_grad():
        want = hf(input_ids=ids, labels=ids).loss.item()
        got = ref.token_losses(ids[:, :-1], ids[:, 1:]).mean().item()
        assert got == pytest.approx(want, rel=1e-5)
        logprobs = torch.log_softmax(hf(input_ids=ids).logits[:, -1].double(), -1)
        assert (ref.next_token_logprobs(ids) - logprobs).abs().max().item() < 1e-5


def _check_all(rank, world, folder, layouts):
    spec = load_model(folder)
    return [
        (text, mode, check_model(rank, world, spec, parse_layout(text), SEQ, BATCH, mode, weights=folder))
        for text in layouts
        for mode in ("train", "decode")
    ]


@pytest.mark.parametrize(
    "name, layouts",
    [
        ("llama3", ["tp=2", "tsp=2", "sp=2", "pp=2", "dp=2,zero=3"]),
        ("qwen3", ["tp=2", "tsp=2"]),
        ("mamba2", ["tpssm=2", "tsp=2", "sp=2"]),
    ],
)
def test_every_rank_reads_its_shard(checkpoints, name, layouts):
    """Each rank's modules read their own slices from the files (not from the reference): the sharded
    loss, gradients and decoded log-probs equal the reference's, whose loss is transformers'."""
    folder, hf = checkpoints[name]
    per_rank = run_distributed(_check_all, 2, folder, layouts, timeout_s=300)
    ids_loss = None
    for i, (text, mode, _) in enumerate(per_rank[0]):
        for r in (ranks[i][2] for ranks in per_rank):
            if mode == "train":
                assert r.get("loss_err", 0.0) < 1e-12, (text, r)
                assert r["max_weight_grad_rel_err"] < 1e-9, (text, r)
                ids_loss = r["ref_loss"]
            else:
                assert r["max_out_err"] < 1e-10, (text, mode, r)
    # The reference's loss on check_model's ids is transformers' loss on them.
    from meshplan.executor.model import synthetic_tokens

    tokens, labels = synthetic_tokens(VOCAB, BATCH, SEQ, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = hf(input_ids=tokens).logits.double()
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()).item()
    assert ids_loss == pytest.approx(want, rel=1e-5)


def test_execute_with_weights_records_transformers_loss(checkpoints, tmp_path):
    folder, hf = checkpoints["llama3"]
    ids = _ids(seed=7)
    np.save(tmp_path / "ids.npy", ids.numpy())
    out = tmp_path / "run.json"
    res = CliRunner().invoke(
        app,
        [
            "execute",
            "--model",
            folder,
            "--weights",
            folder,
            "--layout",
            "tp=2",
            "--seq",
            str(SEQ),
            "--batch",
            str(BATCH),
            "--nproc",
            "2",
            "--steps",
            "1",
            "--tokens",
            str(tmp_path / "ids.npy"),
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    run = json.loads(out.read_text())
    with torch.no_grad():
        want = hf(input_ids=ids, labels=ids).loss.item()
    assert run["weights"] == folder
    assert run["measured"]["loss"] == pytest.approx(want, rel=1e-4)  # the run is fp32
    assert "first-batch loss" in res.output


def test_checkpoints_the_executor_cannot_run_are_refused_in_one_line(checkpoints, tmp_path):
    torch.manual_seed(0)
    qwen = tmp_path / "qwen2"
    Qwen2ForCausalLM(Qwen2Config(**SHAPE)).save_pretrained(qwen)
    runner = CliRunner()
    base = ["execute", "--layout", "tp=2", "--seq", str(SEQ), "--nproc", "2", "--out", str(tmp_path / "r.json")]
    cases = {
        # Qwen2's Q/K/V biases are not in the executor's blocks.
        (str(qwen), str(qwen)): "projection biases",
        # The checkpoint and --model disagree.
        ("dense-7b", checkpoints["llama3"][0]): "another model",
        (checkpoints["llama3"][0], str(tmp_path / "missing")): "no config.json",
    }
    for (model, folder), words in cases.items():
        res = runner.invoke(app, base + ["--model", model, "--weights", folder])
        assert res.exit_code != 0 and words in res.output, (model, folder, res.output)
        assert "Traceback" not in res.output and len(res.output.strip().splitlines()) <= 3, res.output
    # A Mamba-2 config whose gated norm's epsilon the executor does not take.
    bad = tmp_path / "m2eps"
    bad.mkdir()
    raw = json.loads((Path(checkpoints["mamba2"][0]) / "config.json").read_text())
    raw["layer_norm_epsilon"] = 1e-6
    (bad / "config.json").write_text(json.dumps(raw))
    with pytest.raises(MeshplanError, match="layer_norm_epsilon"):
        Checkpoint(bad)

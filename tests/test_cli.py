"""The CLI parses, calls and renders; user errors are one line with exit status 2."""

import json

import pytest
from cli_checks import TINY_LLAMA, one_line_error
from typer.testing import CliRunner

from meshplan.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args))


def test_memory_json_is_one_object_with_components():
    r = invoke("memory", "--model", "dense-7b", "--layout", "tsp=8", "--seq", "128k", "--cluster", "h200-8", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    from meshplan.costmodel.memory import COMPONENTS

    assert set(data["per_gpu_bytes"]) == set(COMPONENTS)
    assert {"parameters", "gradients", "optimizer_state", "activations", "kv_cache", "ssm_state_cache"} <= set(
        COMPONENTS
    )
    assert data["total_bytes"] >= sum(data["per_gpu_bytes"][k] for k in ("parameters", "activations"))
    assert data["seq"] == 131072 and data["fits"] is True and data["layout"] == "tsp=8"


def test_memory_sweep_compares_layouts_and_plots(tmp_path):
    png = tmp_path / "mem.png"
    r = invoke(
        "memory",
        "--model",
        "dense-7b",
        "--layout",
        "tp=8",
        "--layout",
        "tsp=8",
        "--layout",
        "tp=2,sp=4",
        "--sweep-seq",
        "16k,32k",
        "--plot",
        str(png),
        "--json",
    )
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [(x["layout"], x["seq"]) for x in rows] == [
        (lay, s) for lay in ("tp=8", "tsp=8", "tp=2,sp=4") for s in (16384, 32768)
    ]
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_memory_table_renders():
    r = invoke(
        "memory", "--model", "mamba2-2.7b", "--layout", "tpssm=4", "--seq", "8k", "--mode", "decode", "--batch", "8"
    )
    assert r.exit_code == 0, r.output
    assert "SSM$" in r.stdout and "tpssm=4" in r.stdout


def test_user_errors_are_one_line_exit_2():
    for args in (
        ["--layout", "tp=3"],
        ["--layout", "tq=2"],
        ["--layout", "tp=8", "--cluster", "h200-8", "--nodes", "2"],
        ["--layout", "tp=8", "--cluster", "nope"],
        ["--layout", "tp=8", "--seq", "12x"],
        ["--layout", "tp=8", "--mode", "serve"],
    ):
        r = invoke("memory", "--model", "dense-7b", *args)
        assert r.exit_code == 2, (args, r.output)
        assert "Traceback" not in r.output
        assert r.output.strip().startswith("error:") and len(r.output.strip().splitlines()) == 1, r.output


def test_numeric_options_below_their_bound_are_one_line():
    """A count below its least sensible value names the flag and the bound — before any work starts
    (execute's torchrun workers never launch)."""
    cases = [
        (
            ["recommend", "--model", "dense-7b", "--cluster", "h200-8", "--seq", "4k", "--batch", "-1"],
            "--batch must be >= 1, got -1",
        ),
        (
            ["execute", "--model", "dense-7b", "--layout", "tp=2", "--seq", "4k", "--nproc", "2", "--steps", "0"],
            "--steps must be >= 1, got 0",
        ),
        (
            ["execute", "--model", "dense-7b", "--layout", "tp=2", "--seq", "4k", "--nproc", "0"],
            "--nproc must be >= 1, got 0",
        ),
        (
            ["execute", "--model", "dense-7b", "--layout", "tp=2", "--seq", "4k", "--nproc", "2", "--layers", "-1"],
            "--layers must be >= 0, got -1",
        ),
        (["calibrate", "--nproc", "0"], "--nproc must be >= 1, got 0"),
    ]
    for args, message in cases:
        r = invoke(*args)
        assert r.exit_code == 2, (args, r.output)
        assert r.output.strip() == f"error: {message}", r.output


def test_listings():
    models = json.loads(invoke("models", "--json").stdout)
    assert {m["name"] for m in models} >= {"dense-7b", "llama3-8b", "mamba2-130m", "falcon-mamba-7b", "zamba2-7b"}
    clusters = json.loads(invoke("clusters", "--json").stdout)
    assert {c["name"] for c in clusters} >= {"h100-sxm-8", "h200-8", "a100-sxm-8", "a6000-pcie-4", "mi300x-8"}
    tree = invoke("cluster", "show", "h100-sxm-8", "--nodes", "2")
    assert tree.exit_code == 0 and "n1/gpu7" in tree.stdout and "network switch" in tree.stdout


def test_recommend_sp_split_option():
    """--sp-split contiguous prices SP as every rank waiting for the last one's attention: SP's step is
    longer than with the executor's zigzag; a wrong value is one line naming the flag."""
    import json

    def sp_step(split):
        r = CliRunner().invoke(
            app,
            [
                "recommend",
                "--model",
                "dense-7b",
                "--cluster",
                "h200-8",
                "--seq",
                "32k",
                "--json",
                "--all",
                "--sp-split",
                split,
            ],
        )
        assert r.exit_code == 0, r.output
        return next(c["step_time_s"] for c in json.loads(r.output) if c["layout"] == "tp=2,sp=4")

    assert sp_step("contiguous") > 1.2 * sp_step("zigzag")
    r = CliRunner().invoke(app, ["recommend", "--model", "dense-7b", "--cluster", "h200-8", "--sp-split", "ring"])
    assert r.exit_code != 0 and "--sp-split: use zigzag or contiguous" in r.output


def test_memory_shows_the_int8_peer_buffer():
    """TP-SSM 2 with --int8-allreduce: the peer buffer has its own column, and the total includes it.
    Megatron-SP (the megatron stack's default) replaces the all-reduce it quantizes: the flag turns it
    off where not given, and the two given together are one line."""
    from meshplan.cli import app

    base = ["memory", "--model", "mamba2-2.7b", "--layout", "tpssm=2", "--seq", "16k", "--batch", "4"]
    args = base + ["--mode", "prefill", "--no-tp-sequence-parallel", "--json"]
    plain = json.loads(runner.invoke(app, args).stdout)
    int8 = json.loads(runner.invoke(app, args + ["--int8-allreduce"]).stdout)
    buf = int8["per_gpu_bytes"]["int8_peer_buffer"]
    assert buf == 2 * 174_063_616 and plain["per_gpu_bytes"]["int8_peer_buffer"] == 0
    assert int8["total_bytes"] - plain["total_bytes"] == buf
    default = json.loads(runner.invoke(app, base + ["--mode", "prefill", "--int8-allreduce", "--json"]).stdout)
    assert default["total_bytes"] == int8["total_bytes"] and not default["assumptions"]["tp_sequence_parallel"]
    both = runner.invoke(app, base + ["--int8-allreduce", "--tp-sequence-parallel"])
    assert both.exit_code == 2 and "drop one of them" in both.output
    table = runner.invoke(app, args[:-1] + ["--int8-allreduce"]).stdout
    assert "int8buf" in table and "int8 all-reduce" in table


def test_malformed_json_names_the_file_and_the_place(tmp_path):
    bad = tmp_path / "run.json"
    bad.write_text('{"layout": "tp=2\n')
    for args in (["compare", str(bad)], ["memory", "--model", str(bad), "--layout", "tp=2", "--seq", "4k"]):
        r = invoke(*args)
        assert r.exit_code == 2, r.output
        assert r.output.strip().startswith(f"error: {bad}: not valid JSON (") and " at," not in r.output, r.output
        assert "line 1 column" in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_execute_summary_sets_measured_beside_predicted():
    """The line execute prints after a run: each measured figure with the prediction beside it; no
    peak where the run could not measure one (CPU), no predicted time where the model gave none."""
    from meshplan.cli import run_summary

    run = {
        "model": "m/1L",
        "layout": "tp=2",
        "mode": "train",
        "measured": {"step_time_s": 0.0123, "peak_bytes": 3 * 2**30, "comm_bytes": {"a": 2**20, "b": 2**20}},
        "predicted": {"step_time_s": 0.012, "peak_bytes": 2.5 * 2**30, "comm_bytes": {"a": 2**21}},
    }
    assert run_summary(run) == (
        "m/1L · tp=2 · train: step 12.30 ms (predicted 12.00 ms), peak 3.00 GiB a rank "
        "(predicted 2.50 GiB), 2.00 MiB moved a rank a step (predicted 2.00 MiB)"
    )
    run["measured"]["peak_bytes"] = None
    del run["predicted"]["step_time_s"]
    assert run_summary(run) == "m/1L · tp=2 · train: step 12.30 ms, 2.00 MiB moved a rank a step (predicted 2.00 MiB)"


def test_recommend_when_nothing_fits_says_why_without_an_empty_table():
    # The executor's stack with nothing searched (recompute none): the old defaults.
    pinned = ("--stack", "meshplan", "--fixed", "recompute,tp-sequence-parallel,virtual-stages")
    r = invoke("recommend", "--model", "dense-7b", "--cluster", "h200-8", "--seq", "256k", *pinned)
    # Its own exit status (3), not success: a script must not read "nothing fits" as an answer.
    assert r.exit_code == 3, r.output
    assert "Nothing fits in" in r.output and "needs" in r.output
    assert "layout" not in r.output  # no table header with no rows under it
    r = invoke("recommend", "--model", "dense-7b", "--cluster", "h200-8", "--seq", "256k", "--json", *pinned)
    assert r.exit_code == 3 and json.loads(r.stdout) == []
    r = invoke("recommend", "--model", "dense-7b", "--cluster", "h200-8", "--seq", "128k", *pinned)
    assert r.exit_code == 0 and "layout" in r.output and "tsp=8" in r.output


def test_python_m_meshplan_runs_the_cli():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "meshplan", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "recommend" in proc.stdout


def test_files_into_missing_folders_and_a_missing_gpu_are_one_line_errors(tmp_path):
    r = runner.invoke(
        app,
        [
            "memory",
            "--model",
            "dense-7b",
            "--layout",
            "tp=8",
            "--seq",
            "4k",
            "--plot",
            str(tmp_path / "nowhere" / "m.png"),
        ],
    )
    assert r.exit_code == 2 and "--plot: folder" in r.output and len(r.output.strip().splitlines()) == 1
    import torch

    if not torch.cuda.is_available():
        r = runner.invoke(
            app,
            [
                "execute",
                "--model",
                "dense-7b",
                "--layers",
                "2",
                "--layout",
                "tp=2",
                "--seq",
                "1k",
                "--nproc",
                "2",
                "--device",
                "cuda",
            ],
        )
        assert r.exit_code == 2 and "no GPU is visible" in r.output and len(r.output.strip().splitlines()) == 1


def test_execute_runs_the_whole_model_from_a_token_file(tmp_path):
    import numpy as np
    import pytest

    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "hidden_size": 32,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "intermediate_size": 64,
                "vocab_size": 50,
            }
        )
    )
    ids = tmp_path / "ids.npy"
    np.save(ids, np.arange(2 * 17) % 50)
    out = tmp_path / "run.json"
    r = runner.invoke(
        app,
        [
            "execute",
            "--model",
            str(config),
            "--layout",
            "single",
            "--seq",
            "16",
            "--batch",
            "2",
            "--nproc",
            "1",
            "--steps",
            "1",
            "--tokens",
            str(ids),
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    run = json.loads(out.read_text())
    assert run["whole_model"] and run["not_executed"] == ["projection biases"]
    assert run["measured"]["saved_bytes"] == pytest.approx(run["predicted"]["saved_bytes"], rel=0.05)
    bad = tmp_path / "short.npy"
    np.save(bad, np.arange(5))
    r = runner.invoke(
        app,
        [
            "execute",
            "--model",
            str(config),
            "--layout",
            "single",
            "--seq",
            "16",
            "--nproc",
            "1",
            "--tokens",
            str(bad),
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 2 and "--tokens:" in r.output and "needs 17" in r.output


def test_execute_keeps_packed_documents_apart_in_mamba2(tmp_path):
    """A .npz of tokens and documents on sp=2: the run's first-batch loss is the single-process model's
    with seq_idx (the same seeded weights), not its loss over one undivided sequence; a dense model
    is refused packed documents."""
    import numpy as np
    import pytest
    import torch

    from meshplan.executor.model import CausalLM
    from meshplan.hf_config import load_model

    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "mamba2",
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "state_size": 8,
                "head_dim": 8,
                "expand": 2,
                "n_groups": 1,
                "vocab_size": 64,
            }
        )
    )
    gen = np.random.default_rng(0)
    tokens = gen.integers(0, 64, size=(2, 17))
    documents = np.array([[0] * 5 + [1] * 7 + [2] * 5, [0] * 9 + [1] * 8])
    packed = tmp_path / "packed.npz"
    np.savez(packed, tokens=tokens, documents=documents)
    out = tmp_path / "run.json"
    r = runner.invoke(
        app,
        [
            "execute",
            "--model",
            str(config),
            "--layout",
            "sp=2",
            "--seq",
            "16",
            "--batch",
            "2",
            "--nproc",
            "2",
            "--steps",
            "1",
            "--tokens",
            str(packed),
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    measured = json.loads(out.read_text())["measured"]["loss"]
    spec = load_model(str(config))
    torch.manual_seed(1234)  # the executor's reference weights (executor.run.measure)
    ref = CausalLM(spec)
    ids = torch.from_numpy(tokens)
    docs = torch.from_numpy(documents[:, :-1]).int()
    with torch.no_grad():
        want = ref.token_losses(ids[:, :-1], ids[:, 1:], docs).mean().item()
        whole = ref.token_losses(ids[:, :-1], ids[:, 1:]).mean().item()
    assert measured == pytest.approx(want, rel=1e-5) and abs(whole - want) > 1e-4
    dense = tmp_path / "dense.json"
    dense.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 32,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
                "intermediate_size": 64,
                "vocab_size": 64,
            }
        )
    )
    r = runner.invoke(
        app,
        [
            "execute",
            "--model",
            str(dense),
            "--layout",
            "single",
            "--seq",
            "16",
            "--batch",
            "2",
            "--nproc",
            "1",
            "--tokens",
            str(packed),
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 2 and "packs documents" in r.output
    decreasing = tmp_path / "bad.npz"
    np.savez(decreasing, tokens=tokens, documents=documents[:, ::-1])
    r = runner.invoke(
        app,
        [
            "execute",
            "--model",
            str(config),
            "--layout",
            "single",
            "--seq",
            "16",
            "--batch",
            "2",
            "--nproc",
            "1",
            "--tokens",
            str(decreasing),
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 2 and "decrease" in r.output


# Issue 29: what a newcomer typed, each a traceback or a wrong answer with exit 0 before; now one line
# naming the field (and the fix). {tmp} is the test's folder; {config} a llama config.json with `config`.
NEWCOMER_CASES = {
    "plot-format": (
        ["memory", "--model", "dense-7b", "--layout", "tp=8", "--seq", "4k", "--plot", "{tmp}/x.txt"],
        None,
        ["--plot", ".txt", ".png"],
    ),
    "crossover-degree-past-cluster": (
        ["crossover", "--model", "dense-7b", "--degree", "16", "--cluster", "h100-sxm-8"],
        None,
        ["--degree 16", "8 GPUs"],
    ),
    "virtual-stages-0": (
        ["recommend", "--model", "dense-7b", "--cluster", "h200-8", "--virtual-stages", "0"],
        None,
        ["--virtual-stages must be >= 1"],
    ),
    "negative-tolerance": (["compare", "{tmp}/run.json", "--tolerance", "-1"], None, ["--tolerance must be >= 0"]),
    # No data-parallel size makes 128 sequences of micro-batches of 3: the batch, not the memory.
    "global-batch-no-dp-divides": (
        ["recommend", "--model", "dense-7b", "--cluster", "h200-8", "--global-batch", "128", "--micro-batch", "3"],
        None,
        ["--global-batch 128", "--micro-batch 3"],
    ),
    # The int8 all-reduce quantizes TP-SSM's all-reduce: nothing to quantize in these.
    "int8-without-tpssm": (
        ["memory", "--model", "mamba2-130m", "--layout", "tp=2", "--seq", "4k", "--int8-allreduce"],
        None,
        ["--int8-allreduce", "tpssm"],
    ),
    "int8-on-a-dense-model": (
        ["recommend", "--model", "dense-7b", "--cluster", "h200-8", "--int8-allreduce"],
        None,
        ["--int8-allreduce", "dense-7b has none"],
    ),
    # A width of 0 in a config: the file and its key, not the spec's field.
    "config-width-0": (
        ["memory", "--model", "{config}", "--layout", "tp=2"],
        {"hidden_size": 0},
        ["{config}", "hidden_size"],
    ),
    # A shape the config cannot make: the file and its keys named.
    "config-kv-heads": (
        ["memory", "--model", "{config}", "--layout", "tp=2"],
        {"num_key_value_heads": 3},
        ["{config}", "num_key_value_heads"],
    ),
}


@pytest.mark.parametrize("case", list(NEWCOMER_CASES))
def test_bad_inputs_a_newcomer_tried_are_one_line_naming_the_field(tmp_path, case):
    args, config, words = NEWCOMER_CASES[case]
    path = tmp_path / "config.json"
    if config is not None:
        path.write_text(json.dumps({**TINY_LLAMA, **config}))

    def fill(text):
        return text.replace("{tmp}", str(tmp_path)).replace("{config}", str(path))

    r = invoke(*map(fill, args))
    assert "Nothing fits" not in r.output
    one_line_error(r, *map(fill, words))
    assert not (tmp_path / "x.txt").exists()


def test_calibrate_checks_its_inputs_before_launching(tmp_path):
    import time

    t0 = time.perf_counter()
    r = invoke("calibrate", "--nproc", "2", "--device", "cpu", "--out", str(tmp_path / "missing" / "p.toml"))
    one_line_error(r, "--out", "does not exist")
    import torch

    if not torch.cuda.is_available():
        one_line_error(invoke("calibrate", "--nproc", "2", "--out", str(tmp_path / "p.toml")), "no GPU is visible")
    assert time.perf_counter() - t0 < 10  # nothing launched (a launch alone takes longer)


def test_one_layout_costs_the_same_in_memory_predict_and_recommend():
    """Defaults come from --stack in every command: the megatron stack's fp32 gradients and Megatron-SP,
    the meshplan stack's bf16 gradients without it; each output names the stack it assumed."""
    shape = ["--model", "dense-7b", "--seq", "32k"]
    for stack, grad_bytes, sp in (("megatron", 4, True), ("meshplan", 2, False)):
        mem = json.loads(invoke("memory", *shape, "--layout", "tp=8", "--stack", stack, "--json").stdout)
        pred = json.loads(
            invoke("predict", *shape, "--layout", "tp=8", "--cluster", "h200-8", "--stack", stack, "--json").stdout
        )
        # Megatron-SP searched is on; under meshplan it is pinned at the stack's default (off).
        fixed = "micro-batch,virtual-stages" + ("" if sp else ",tp-sequence-parallel")
        rec = invoke(
            "recommend", *shape, "--cluster", "h200-8", "--stack", stack, "--recompute", "none", "--fixed", fixed
        )
        rows = json.loads(
            invoke(
                "recommend",
                *shape,
                "--cluster",
                "h200-8",
                "--stack",
                stack,
                "--recompute",
                "none",
                "--fixed",
                fixed,
                "--json",
                "--all",
            ).stdout
        )
        tp8 = next(r for r in rows if r["layout"] == "tp=8")
        assert mem["total_bytes"] == pred["total_bytes"] == tp8["total_bytes"], stack
        # Gradients in the stack's dtype: bytes per weight against the bf16 weights' 2.
        assert mem["per_gpu_bytes"]["gradients"] == mem["per_gpu_bytes"]["parameters"] * grad_bytes // 2
        assert mem["assumptions"]["stack"] == pred["assumptions"]["stack"] == tp8["assumptions"]["stack"] == stack
        assert mem["assumptions"]["tp_sequence_parallel"] == pred["assumptions"]["tp_sequence_parallel"] == sp
        assert tp8["knobs"]["tp_sequence_parallel"] == sp
        flat = " ".join(rec.output.split())  # the assumed line wraps at the console's width
        assert f"stack {stack}" in flat and f"grads {'fp32' if grad_bytes == 4 else 'bf16'}" in flat
        table = invoke("memory", *shape, "--layout", "tp=8", "--stack", stack).output
        assert f"stack {stack}" in table and f"Megatron-SP {'on' if sp else 'off'}" in table


def test_tables_explain_their_words():
    """Every abbreviation a table prints has a legend under it."""
    rec = invoke("recommend", "--model", "dense-7b", "--cluster", "h200-8", "--seq", "128k", "--top", "3")
    assert rec.exit_code == 0, rec.output
    for word in ("rc=", "mbs=", "tp-sp", "regime"):
        assert word in rec.output
    for meaning in ("rc = activation recompute", "mbs = micro-batch size", "tp-sp = Megatron sequence parallel"):
        assert meaning in " ".join(rec.output.split()), meaning
    assert "v = interleaved virtual pipeline stages" in " ".join(rec.output.split())
    assert "regime = the tokens a micro-batch puts through a layer" in " ".join(rec.output.split())
    models = " ".join(invoke("models").output.split())
    assert "8.85B" in models and "gated 16384 (4×)" in models and "4×-wide gated MLP" in models
    rows = {m["name"]: m for m in json.loads(invoke("models", "--json").stdout)}
    assert rows["dense-7b"]["ffn_hidden"] == 4 * rows["dense-7b"]["d_model"] and rows["dense-7b"]["mlp_gated"]
    mem = " ".join(invoke("memory", "--model", "dense-7b", "--layout", "tsp=8", "--seq", "32k").output.split())
    for label in ("params = weights", "optim = Adam", "acts = activations", "KVgath = K/V gathered"):
        assert label in mem, label
    pred = invoke("predict", "--model", "dense-7b", "--cluster", "h200-8", "--layout", "tp=8", "--seq", "4k")
    flat = " ".join(pred.output.split())
    assert "MFU = model FLOPs" in flat and "grads fp32" in flat
    # The stack is named with its release and the attention kernel its rates are of
    assert "stack megatron (Megatron-Core 0.8-0.15 + Transformer Engine 1.8-2.9" in flat and "attention: cuDNN" in flat
    assert "bf16 TFLOP/s = each GPU's dense peak" in " ".join(invoke("clusters").output.split())


def test_memory_plot_stacks_components_in_tokens_under_the_gpus_capacity():
    """The plot a practitioner reads without the README: ticks in tokens (8K, not 2¹³), one stacked bar
    per layout and length whose components sum to the total, the GPU's capacity, the assumptions."""
    from meshplan.costmodel.options import CostOptions
    from meshplan.layout import parse_layout
    from meshplan.models import PRESETS
    from meshplan.plots import memory_figure
    from meshplan.reports import memory_records
    from meshplan.topologies.cluster import load_cluster

    opts = CostOptions(stack="megatron", grad_dtype="fp32", tp_sequence_parallel=True)
    layouts = [parse_layout(x) for x in ("tp=8", "tsp=8")]
    records = memory_records(PRESETS["dense-7b"], layouts, [8192, 32768], 1, opts, load_cluster("h200-8"))
    for r in records:
        assert sum(r["at_peak_bytes"].values()) == r["total_bytes"]
    fig = memory_figure(records)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["8K", "32K"]
    gib = 2**30
    heights = [p.get_height() for p in ax.patches if p.get_height() > 0]
    # each bar: the allocator's components, then what lies beside it (the CUDA context, NCCL's buffers)
    held = sum(r["total_bytes"] + r["outside_allocator_bytes"] for r in records)
    assert sum(heights) * gib == pytest.approx(held, rel=1e-9)
    assert any(list(line.get_ydata()) == [140.4 * 2**30 / gib] * 2 for line in ax.lines) or any(
        abs(line.get_ydata()[0] - records[0]["gpu_memory_bytes"] / gib) < 1e-9 for line in ax.lines
    )
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "activations saved for backward" in legend and "optimizer state (Adam)" in legend
    caption = " ".join(t.get_text() for t in fig.texts)
    assert "stack megatron" in caption and "grads fp32" in caption and "Megatron-SP on" in caption
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_cluster_show_summarises_large_clusters_quickly():
    import time

    t0 = time.perf_counter()
    r = invoke("cluster", "show", "h100-sxm-8", "--nodes", "100000")
    assert r.exit_code == 0, r.output
    assert time.perf_counter() - t0 < 10  # was past 120 s
    assert "800,000 ×" in r.output and "n1/gpu7 (rank 15)" in r.output and "n2/gpu0" not in r.output
    assert "nodes 2–99999 (99,998 more)" in r.output and "799,999" in r.output
    one_line_error(invoke("cluster", "show", "h100-sxm-8", "--nodes", "100000", "--json"), "--json", "--nodes")
    small = json.loads(invoke("cluster", "show", "h100-sxm-8", "--nodes", "2", "--json").stdout)
    assert sum(1 for n in small["nodes"] if n["kind"] == "gpu") == 16


def test_first_layers_keeps_a_models_proportions():
    """execute --layers cuts a model to its first layers: a hybrid keeps at least one shared-block
    invocation, a windowed model its share of windowed layers; more layers than the model has is one
    line naming --layers."""
    from dataclasses import replace

    from meshplan.errors import MeshplanError
    from meshplan.models import PRESETS, first_layers

    zamba = first_layers(PRESETS["zamba2-7b"], 1)
    assert zamba.layers == 1 and zamba.hybrid_layers == 1 and zamba.name == "zamba2-7b/1L"
    assert first_layers(PRESETS["zamba2-7b"], 40).hybrid_layers == round(13 * 40 / 81)
    # The cut holds the shared-block copies its invocations run, as the executor builds it.
    import torch

    from meshplan.executor.model import CausalLM

    for k, copies in ((6, 1), (40, 2)):
        cut = first_layers(PRESETS["zamba2-7b"], k)
        with torch.device("meta"):
            built = sum(p.numel() for p in CausalLM(cut).parameters())
        assert cut.shared_blocks == copies and built == cut.param_count()
    windowed = replace(PRESETS["dense-7b"], attention_window=4096, window_layers=16)
    assert first_layers(windowed, 2).window_layers == 1 and first_layers(windowed, 1).window_layers == 1
    assert first_layers(PRESETS["dense-7b"], 32) is PRESETS["dense-7b"]
    with pytest.raises(MeshplanError, match="--layers: dense-7b has 32 layers; give 1 to 32"):
        first_layers(PRESETS["dense-7b"], 33)

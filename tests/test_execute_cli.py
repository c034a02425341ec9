"""meshplan execute / compare end to end on CPU (torchrun, gloo), and their errors."""

import json

from typer.testing import CliRunner

from meshplan.cli import app

runner = CliRunner()
TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 100,
}


def test_execute_then_compare(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    out = tmp_path / "run.json"
    r = runner.invoke(
        app,
        [
            "execute",
            "--model",
            str(config),
            "--layout",
            "tp=2",
            "--seq",
            "64",
            "--nproc",
            "2",
            "--out",
            str(out),
            "--steps",
            "2",
            "--timeout",
            "120",
        ],
    )
    assert r.exit_code == 0, r.output
    run = json.loads(out.read_text())
    assert run["world"] == 2 and run["measured"]["comm_bytes"] == run["predicted"]["comm_bytes"]
    c = runner.invoke(app, ["compare", str(out), "--json"])
    assert c.exit_code == 0, c.output
    report = json.loads(c.stdout)
    assert report["ok"] and any(row["quantity"] == "bytes all_reduce/tp" for row in report["rows"])


def test_compare_fails_beyond_tolerance_and_on_bad_input(tmp_path):
    run = {
        "model": "m",
        "layout": "tp=2",
        "mode": "train",
        "seq": 64,
        "device": "cpu",
        "predicted": {"comm_bytes": {"all_reduce/tp": 100.0}, "saved_bytes": 1000.0},
        "measured": {"comm_bytes": {"all_reduce/tp": 100.0}, "saved_bytes": 1200.0},
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    assert runner.invoke(app, ["compare", str(path)]).exit_code == 1  # saved activations 20% off
    assert runner.invoke(app, ["compare", str(path), "--tolerance", "0.25"]).exit_code == 0
    run["measured"]["comm_bytes"]["all_reduce/tp"] = 101.0  # bytes must match exactly
    path.write_text(json.dumps(run))
    assert runner.invoke(app, ["compare", str(path), "--tolerance", "0.25"]).exit_code == 1
    (tmp_path / "bad.json").write_text("{not json")
    bad = runner.invoke(app, ["compare", str(tmp_path / "bad.json")])
    assert bad.exit_code == 2 and bad.output.startswith("error:")
    missing = runner.invoke(app, ["compare", str(tmp_path / "nope.json")])
    assert missing.exit_code == 2


def test_execute_rejects_bad_layouts_before_launching():
    r = runner.invoke(app, ["execute", "--model", "dense-7b", "--layout", "tp=3", "--seq", "64", "--nproc", "3"])
    assert r.exit_code == 2 and "does not divide" in r.output
    r = runner.invoke(app, ["execute", "--model", "dense-7b", "--layout", "tp=4", "--seq", "64", "--nproc", "2"])
    assert r.exit_code == 2 and "uses 4 GPUs" in r.output

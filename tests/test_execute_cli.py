"""meshplan execute / compare end to end on CPU (torchrun, gloo), and their errors."""

import json
from pathlib import Path

import pytest
from cli_checks import TINY_LLAMA as TINY
from cli_checks import one_line_error
from typer.testing import CliRunner

from meshplan.cli import app

runner = CliRunner()


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
    r = runner.invoke(app, ["compare", str(path)])
    assert r.exit_code == 1  # saved activations 20% off
    assert "error = (measured − predicted) / predicted; ok = within --tolerance 0.05" in " ".join(r.output.split())
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


# Issue 29: each of these ran (or failed) as something else than asked; now one line before launching.
# {config} is a 2-layer llama config.json, {ids} a 3-D array of token ids.
_RUN = ["--seq", "64", "--out", "{tmp}/run.json"]
EXECUTE_CASES = {
    # 5 layers of a 2-layer model ran 5 layers.
    "layers-past-the-model": (
        ["--model", "{config}", "--layout", "tp=2", "--nproc", "2", "--layers", "5"],
        ["--layers", "has 2 layers"],
    ),
    # The int8 all-reduce is TP-SSM's: under tp=2 it was silently ignored.
    # A graph was asked for a step that is not captured (the CPU's, here): said, not run eagerly instead.
    "cuda-graph-off-the-gpu": (
        ["--model", "{config}", "--layout", "tp=2", "--nproc", "2", "--cuda-graph"],
        ["--cuda-graph", "device: CUDA graphs need a GPU"],
    ),
    "int8-on-tp": (
        ["--model", "{config}", "--layout", "tp=2", "--nproc", "2", "--int8-allreduce"],
        ["--int8-allreduce"],
    ),
    "int8-on-mamba-tp": (
        ["--model", "mamba2-130m", "--layout", "tp=2", "--nproc", "2", "--int8-allreduce"],
        ["--int8-allreduce", "tpssm"],
    ),
    # A 3-D array of ids was read flat.
    "tokens-3d": (
        ["--model", "{config}", "--layout", "single", "--nproc", "1", "--tokens", "{ids}"],
        ["--tokens", "3-D"],
    ),
    "negative-tolerance": (
        ["--model", "{config}", "--layout", "single", "--nproc", "1", "--tolerance", "-1"],
        ["--tolerance"],
    ),
    "zero-timeout": (["--model", "{config}", "--layout", "single", "--nproc", "1", "--timeout", "0"], ["--timeout"]),
    # A hybrid cut to one layer: what the executor cannot build, not a spec's complaint about the cut.
    "hybrid-layers": (
        ["--model", "zamba2-7b", "--layers", "1", "--layout", "tsp=2", "--nproc", "2"],
        ["zamba2-7b's shared blocks", "not tsp=2"],
    ),
}


@pytest.mark.parametrize("case", list(EXECUTE_CASES))
def test_execute_refuses_what_it_would_run_wrongly_before_launching(tmp_path, case):
    import numpy as np

    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    ids = tmp_path / "ids.npy"
    np.save(ids, np.zeros((2, 3, 65), dtype=np.int64))
    args, words = EXECUTE_CASES[case]

    def fill(text):
        return text.replace("{config}", str(config)).replace("{ids}", str(ids)).replace("{tmp}", str(tmp_path))

    one_line_error(runner.invoke(app, ["execute", *map(fill, args + _RUN)]), *words)
    assert not (tmp_path / "run.json").exists()


def test_tokens_rows_are_read_as_rows(tmp_path):
    """A 2-D array is rows of ids (sequences × tokens): each row's first seq + 1 ids, not the array read
    flat across rows."""
    import numpy as np

    from meshplan.executor.model import tokens_from_file

    rows = np.arange(3 * 20).reshape(3, 20)
    path = tmp_path / "rows.npy"
    np.save(path, rows)
    tokens, labels, documents = tokens_from_file(str(path), 100, 2, 8)
    assert tokens.tolist() == [list(range(0, 8)), list(range(20, 28))]
    assert labels.tolist() == [list(range(1, 9)), list(range(21, 29))] and documents is None
    np.save(path, np.arange(40))  # a 1-D stream is cut into rows
    assert tokens_from_file(str(path), 100, 2, 8)[0].tolist() == [list(range(0, 8)), list(range(9, 17))]


def test_workers_report_progress_and_the_cli_stops_at_the_timeout(tmp_path):
    """Each finished step comes back as a progress record (the CLI's bar); a run past --timeout is
    stopped at --timeout, not minutes later, and its run file keeps the steps that finished."""
    import time

    from meshplan.executor.runspec import RunSpec, spec_file
    from meshplan.executor.torchrun import run_workers, worker_command

    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    out = tmp_path / "run.json"
    spec = RunSpec(model=str(config), layout="tp=2", seq=64, out=str(out), steps=2, timeout=120)
    seen = []
    with spec_file(spec) as path:
        records = run_workers(worker_command("meshplan.executor.worker", path, nproc=2), 120, seen.append)
    assert records == seen
    assert [r["what"] for r in records] == [
        "first-batch loss",
        "warm-up step 1/2",
        "warm-up step 2/2",
        "step 1/2",
        "step 2/2",
        "saved activations counted",
    ]
    assert [r["done"] for r in records] == list(range(1, 7)) and {r["total"] for r in records} == {6}
    run = json.loads(out.read_text())
    assert run["status"] == "ok"
    assert [r["seconds"] for r in records[3:5]] == pytest.approx(run["per_rank"][0]["step_times_s"], rel=1e-5)

    t0 = time.monotonic()
    r = runner.invoke(
        app,
        ["execute", "--model", str(config), "--layout", "tp=2", "--seq", "64", "--nproc", "2"]
        + ["--steps", "1000000", "--timeout", "12", "--out", str(out)],
    )
    took = time.monotonic() - t0
    one_line_error(r, "did not finish in 12 s (--timeout)", str(out))
    assert took < 12 + 25, took  # the launcher and its workers stopped, not left to run
    failed = json.loads(out.read_text())
    assert failed["status"] == "failed" and failed["failure"] == {"timed_out": True}
    steps = [s for s in failed["finished"] if s["what"].startswith("step ")]
    assert steps and failed["measured"]["step_times_s"] == [s["seconds"] for s in steps]


def test_a_killed_rank_is_named_with_its_signal_and_the_finished_steps_are_kept(tmp_path):
    """kill -9 of one worker of a tp=2 CPU run: one line naming the rank and the signal, and a run file
    with status failed that records the steps that finished."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    out = tmp_path / "run.json"
    cmd = [sys.executable, "-m", "meshplan", "execute", "--model", str(config), "--layout", "tp=2", "--seq", "64"]
    cmd += ["--nproc", "2", "--steps", "1000000", "--timeout", "50", "--out", str(out)]
    cli = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def rank1_worker():
        """The worker of rank 1 under this CLI (its ancestors include the CLI's process)."""
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                env = (proc / "environ").read_bytes().split(b"\0")
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"meshplan.executor.worker" in cmdline and b"RANK=1" in env and b"LOCAL_RANK=1" in env:
                pid = int(proc.name)
                while pid > 1:
                    if pid == cli.pid:
                        return int(proc.name)
                    try:
                        pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
                    except (OSError, IndexError, ValueError):
                        break
        return None

    try:
        deadline = time.monotonic() + 40
        victim = None
        while victim is None and time.monotonic() < deadline:
            time.sleep(0.5)
            victim = rank1_worker()
        assert victim is not None, "rank 1 never started"
        time.sleep(4)  # a few steps finish first
        os.kill(victim, signal.SIGKILL)
        _, err = cli.communicate(timeout=40)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert cli.returncode == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: rank 1 was killed by SIGKILL (signal 9"), err
    run = json.loads(out.read_text())
    assert run["status"] == "failed" and run["failure"]["rank"] == 1 and run["failure"]["signal"] == "SIGKILL"
    # The steps that finished before the kill (usually some; on a loaded machine possibly none) are
    # recorded, and the message says how far the run got.
    steps = run["measured"]["step_times_s"]
    assert all(t > 0 for t in steps) and ", after " in lines[0], (lines[0], steps)
    assert not steps or "nothing had finished" not in lines[0]
    assert run["layout"] == "tp=2" and run["world"] == 2
    c = runner.invoke(app, ["compare", str(out)])
    one_line_error(c, "did not complete")


class _Launched(Exception):
    pass


def test_execute_hands_every_worker_one_record(tmp_path, monkeypatch):
    """What the CLI checked reaches the workers as one RunSpec file, whose path is the worker's one
    argument (no options to parse again), and is removed once the run is over."""
    import os

    import meshplan.cli as cli
    from meshplan.executor.runspec import RunSpec

    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    seen = {}

    def launched(cmd, timeout, label):
        assert cmd[-3:-1] == ["-m", "meshplan.executor.worker"] and "--nproc-per-node=2" in cmd
        seen["path"], seen["spec"] = cmd[-1], RunSpec.read(cmd[-1])
        raise _Launched

    monkeypatch.setattr(cli, "run_with_progress", launched)
    out = str(tmp_path / "run.json")
    r = runner.invoke(
        app,
        ["execute", "--model", str(config), "--layout", "tp=2", "--seq", "1k", "--nproc", "2", "--layers", "1"]
        + ["--mode", "prefill", "--steps", "3", "--timeout", "50", "--out", out],
    )
    assert isinstance(r.exception, _Launched), r.output
    assert seen["spec"] == RunSpec(
        model=str(config), layout="tp=2", seq=1024, out=out, mode="prefill", steps=3, timeout=50.0, layers=1
    )
    assert not os.path.exists(seen["path"])


def test_a_run_record_reads_back_what_was_written_and_names_an_unknown_field(tmp_path):
    from meshplan.executor.runspec import CalibrationSpec, RunSpec

    spec = RunSpec(model="dense-7b", layout="tp=2,sp=2", seq=16384, out="r.json", tokens="t.npz", profile=True)
    path = str(tmp_path / "spec.json")
    spec.write(path)
    assert RunSpec.read(path) == spec
    CalibrationSpec(out="p.toml", quick=True).write(path)
    with pytest.raises(ValueError, match="RunSpec has no field\\(s\\) max_bytes, quick"):
        RunSpec.read(path)


def test_compare_says_what_the_times_were_predicted_on(tmp_path):
    """A GPU run records the cluster its times were predicted on and whether it was calibrated; compare says
    which, and for a preset that its links are priced at the datasheet rate."""
    from meshplan.executor.worker import predicted_on
    from meshplan.topologies import load_cluster

    profile = Path(__file__).parent.parent / "meshplan/topologies/profiles/h200-2gpu-2026-11-26.toml"
    assert predicted_on(load_cluster("h200-8")) == {"cluster": "h200-8", "calibrated": None}
    assert predicted_on(load_cluster(str(profile)), str(profile)) == {
        "cluster": str(profile),
        "calibrated": "2026-11-26",
    }
    assert predicted_on(None) is None
    run = {
        "model": "m",
        "layout": "tp=2",
        "mode": "train",
        "seq": 64,
        "device": "cpu",  # (the times themselves are compared on GPU runs only)
        "predicted": {"comm_bytes": {"all_reduce/tp": 100.0}},
        "measured": {"comm_bytes": {"all_reduce/tp": 100.0}},
    }
    for on, says in (
        (predicted_on(load_cluster("h200-8")), "times predicted on h200-8, a preset: its links at the datasheet rate"),
        (predicted_on(load_cluster(str(profile)), "p.toml"), "times predicted on p.toml, calibrated 2026-11-26"),
    ):
        path = tmp_path / "run.json"
        path.write_text(json.dumps(dict(run, predicted_on=on)))
        r = runner.invoke(app, ["compare", str(path)])
        assert r.exit_code == 0 and says in " ".join(r.output.split()), r.output
        assert json.loads(runner.invoke(app, ["compare", str(path), "--json"]).stdout)["predicted_on"] == on


def test_execute_refuses_an_unknown_cluster_in_one_line():
    run = ["execute", "--model", "dense-7b", "--layout", "tp=2", "--seq", "64", "--nproc", "2", "--cluster"]
    r = runner.invoke(app, [*run, "h200-9", "--device", "cuda"])
    assert r.exit_code == 2 and r.output.startswith("error: --cluster: 'h200-9' is neither a preset")
    r = runner.invoke(app, [*run, "h200-8"])  # on the CPU no time is predicted
    assert r.exit_code == 2 and r.output.startswith("error: --cluster: times are predicted for GPU runs only")

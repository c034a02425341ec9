"""Calibration: the α-β fit, the profile round trip, and the cost model using what was measured."""

from dataclasses import replace

import pytest
from typer.testing import CliRunner

from meshplan.cli import app
from meshplan.costmodel.collectives import Comm
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.step import _Links, estimate_step
from meshplan.errors import MeshplanError
from meshplan.layout import Layout
from meshplan.models import PRESETS
from meshplan.topologies.calibrate import fit_alpha_bandwidth, profile_toml
from meshplan.topologies.cluster import load_cluster, load_toml


def test_fit_recovers_alpha_and_bandwidth():
    alpha, bw = 12e-6, 150e9
    points = [(m, alpha + m / bw) for m in (2**16, 2**20, 2**24, 2**28)]
    got_alpha, got_bw = fit_alpha_bandwidth(points)
    assert got_alpha == pytest.approx(alpha, rel=1e-6) and got_bw == pytest.approx(bw, rel=1e-6)


def _profile(tmp_path, measured):
    from importlib import resources

    base = (resources.files("meshplan.topologies") / "presets" / "h200-8.toml").read_text()
    path = tmp_path / "profile.toml"
    path.write_text(profile_toml(base, measured, "meshplan calibrate --nproc 8 --quick"))
    return path


def test_profile_round_trip_and_use(tmp_path):
    points = [(m, 20e-6 + m / 100e9) for m in (2**16, 2**20, 2**24)]
    measured = {
        "collectives": {"all_reduce/8": points},
        "gemm_efficiency": 0.6,
        "hbm_bytes_per_s": 4e12,
        "attention_causal": [(4096, 0.3), (16384, 0.4)],
        "attention_prefix": [(8192, 0.2)],
    }
    cluster = load_toml(_profile(tmp_path, measured))
    cal = cluster.calibration
    assert cal.gemm_efficiency == pytest.approx(0.6) and cal.hbm_bytes_per_s == pytest.approx(4e12)
    alpha, bw = cal.collective("all_reduce", 8)
    assert alpha == pytest.approx(20e-6, rel=1e-3) and bw == pytest.approx(100e9, rel=1e-3)
    # The step model times that collective as measured, not from the preset's link.
    links = _Links(Layout(tp=8), cluster)
    c = Comm("all_reduce", "tp", 2**26, 8)
    assert links.time_s(c) == pytest.approx(alpha + 2**26 / bw)
    # A slower measured GEMM makes the same step slower.
    plain = estimate_step(PRESETS["dense-7b"], Layout(tp=8), 16384, 1, CostOptions(), load_cluster("h200-8"))
    slow = estimate_step(PRESETS["dense-7b"], Layout(tp=8), 16384, 1, CostOptions(), cluster)
    assert slow.compute_s > plain.compute_s


def test_profile_typos_are_named(tmp_path):
    path = _profile(tmp_path, {"collectives": {}})
    path.write_text(path.read_text() + "gemm_eficiency = 0.7\n")
    with pytest.raises(MeshplanError, match="unknown key \\[calibration\\] 'gemm_eficiency'"):
        load_toml(path)


def test_calibrate_cli_on_cpu(tmp_path, monkeypatch):
    """The CPU calibration writes a profile; its progress bar is fed one record a measurement (every
    collective at 64 KiB and 1 MiB on the one group of 2), counted against the whole."""
    from meshplan.executor import torchrun

    seen = []
    run_workers = torchrun.run_workers

    def recording(cmd, timeout, on_progress=None):
        return run_workers(cmd, timeout, lambda r: (seen.append(r), on_progress(r)))

    monkeypatch.setattr(torchrun, "run_workers", recording)
    out = tmp_path / "p.toml"
    r = CliRunner().invoke(
        app, ["calibrate", "--nproc", "2", "--device", "cpu", "--quick", "--max-bytes", "1048576", "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    assert [x["done"] for x in seen] == list(range(1, 13)) and {x["total"] for x in seen} == {12}
    assert (
        seen[0]["what"] == "all_reduce on 2 ranks, 0.06 MiB" and seen[-1]["what"] == "all_to_all on 2 ranks, 1.00 MiB"
    )
    cal = load_toml(out).calibration
    kinds = {key.split("/")[0] for key, _, _ in cal.collectives}
    assert kinds == {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv", "all_to_all"}
    assert all(alpha >= 0 and bw > 0 for _, alpha, bw in cal.collectives)


def test_calibrated_hbm_replaces_the_streaming_rate_not_the_rated_one():
    """The measured fractions (eager factors, kernel rates) are relative to the datasheet rate, so a
    calibrated profile changes what streams at full speed, not what those fractions apply to."""
    from pathlib import Path

    from meshplan.costmodel.device import Device
    from meshplan.topologies import load_cluster

    profile = Path(__file__).parent.parent / "meshplan/topologies/profiles/h200-2gpu-2026-11-22.toml"
    dev, preset = Device.of(load_cluster(str(profile))), Device.of(load_cluster("h200-8"))
    assert dev.hbm_bytes_per_s == pytest.approx(3.8629e12)
    assert dev.rated_hbm == preset.rated_hbm == preset.hbm_bytes_per_s == pytest.approx(4.8e12)


def test_calibrated_host_cost_sets_the_launch_floor(tmp_path):
    """A profile's measured host time per kernel replaces the constants in the launch floor, per block
    family: a launch-bound step scales with it, by hand: kernels × cost."""
    from meshplan.costmodel.blocks.launches import step_kernels_per_block
    from meshplan.costmodel.device import STEP_KERNEL_HOST_S

    measured = {
        "collectives": {},
        "host_kernel_s": 30e-6,
        "decode_host_kernel_s": 25e-6,
        "mamba2_host_kernel_s": 2 * STEP_KERNEL_HOST_S,
        "mamba2_decode_host_kernel_s": 20e-6,
    }
    cluster = load_toml(_profile(tmp_path, measured))
    cal = cluster.calibration
    assert cal.mamba2_host_kernel_s == pytest.approx(2 * STEP_KERNEL_HOST_S)
    assert (cal.host_kernel_s, cal.decode_host_kernel_s) == pytest.approx((30e-6, 25e-6))
    model = replace(PRESETS["mamba2-2.7b"], layers=2)
    kernels = 2 * step_kernels_per_block("mamba2", "train", Layout())
    plain = estimate_step(model, Layout(), 4096, 1, CostOptions(), load_cluster("h200-8"), embeddings=False)
    slow = estimate_step(model, Layout(), 4096, 1, CostOptions(), cluster, embeddings=False)
    assert plain.breakdown["host_s"] == pytest.approx(kernels * STEP_KERNEL_HOST_S)
    assert slow.breakdown["host_s"] == pytest.approx(kernels * 2 * STEP_KERNEL_HOST_S)
    assert slow.step_time_s == pytest.approx(kernels * 2 * STEP_KERNEL_HOST_S)  # now launch-bound
    assert slow.bound.startswith("launch-bound")
    decode = estimate_step(model, Layout(), 4096, 8, CostOptions(mode="decode"), cluster, embeddings=False)
    assert decode.breakdown["decode_host_s"] == pytest.approx(
        2 * step_kernels_per_block("mamba2", "decode", Layout()) * 20e-6
    )
    # A dense stack takes the other blocks' cost: attention and MLP invocations at 30 µs a kernel.
    dense = replace(PRESETS["dense-7b"], layers=2)
    est = estimate_step(dense, Layout(), 4096, 1, CostOptions(), cluster, embeddings=False)
    by_hand = (
        2
        * (step_kernels_per_block("attention", "train", Layout()) + step_kernels_per_block("mlp", "train", Layout()))
        * 30e-6
    )
    assert est.breakdown["host_s"] == pytest.approx(by_hand)


def test_profile_host_cost_must_be_positive(tmp_path):
    path = _profile(tmp_path, {"collectives": {}})
    path.write_text(path.read_text() + "host_kernel_us = 0\n")
    with pytest.raises(MeshplanError, match=r"\[calibration\] host_kernel_us must be a positive number, got 0"):
        load_toml(path)


def test_calibration_sizes_each_collective_as_the_model_and_the_executor_do():
    """The α-β fit divides a timed collective's message by the bandwidth, and the model applies it to
    Comm.message_bytes: an all-gather's is the gathered output (volume_factor (n-1)/n of it crosses a link;
    the executor counts the same, comm.all_gather_start), so calibrate records n times a rank's buffer; a
    reduce-scatter's is its whole input, the others' their buffer."""
    from meshplan.costmodel.collectives import volume_factor
    from meshplan.executor.calibrate_run import message_bytes

    n, buf = 4, 2**20
    assert message_bytes("all_gather", buf, n) == n * buf
    assert volume_factor("all_gather", n) * message_bytes("all_gather", buf, n) == (n - 1) * buf  # what a rank receives
    for kind in ("all_reduce", "reduce_scatter", "broadcast", "send_recv", "all_to_all"):
        assert message_bytes(kind, buf, n) == buf


def test_a_profile_that_timed_no_collective_over_a_group_says_so():
    """A calibrated profile prices the group sizes it timed and leaves the rest at the preset's datasheet
    link rate; predict and recommend name those sizes in one note, and say nothing on a plain preset."""
    from pathlib import Path

    from meshplan.layout import parse_layout
    from meshplan.predict import uncalibrated_sizes

    profile = str(Path(__file__).parent.parent / "meshplan/topologies/profiles/h200-4gpu-2026-11-26b.toml")
    cluster = load_cluster(profile)  # timed over 2 and 4 ranks

    def sizes(layout, on=cluster, mode="train"):
        return uncalibrated_sizes(PRESETS["dense-7b"], on, parse_layout(layout), 16384, 1, CostOptions(mode=mode))

    assert sizes("tp=8") == [8]
    assert sizes("sp=2,dp=4") == [8]  # the gradients' all-reduce over dp × sp
    assert sizes("dp=2,tp=4") == [] and sizes("tsp=2,dp=4") == []  # (no collective over edp's 8 in a dense model)
    assert sizes("dp=8", mode="decode") == []  # decode runs no collective over dp
    assert sizes("tp=8", on=load_cluster("h200-8")) == []
    runner = CliRunner()
    say = "the profile timed no collective over 8 ranks"
    r = runner.invoke(app, ["predict", "--model", "dense-7b", "--cluster", profile, "--layout", "tp=8", "--seq", "16k"])
    assert r.exit_code == 0 and say in " ".join(r.output.split()), r.output
    plain = runner.invoke(
        app, ["predict", "--model", "dense-7b", "--cluster", "h200-8", "--layout", "tp=8", "--seq", "16k"]
    )
    assert plain.exit_code == 0 and "timed no collective" not in plain.output
    r = runner.invoke(
        app, ["predict", "--model", "dense-7b", "--cluster", profile, "--layout", "tp=8", "--seq", "16k", "--json"]
    )
    import json

    assert json.loads(r.stdout)["uncalibrated_group_sizes"] == [8]


def test_a_calibrated_collective_is_read_between_its_measured_sizes(tmp_path):
    """Between two measured sizes a collective takes the line through them (NCCL's time bends between its
    regimes, which one α-β line over every size misses); outside them, the fit."""
    points = [(2**20, 50e-6), (2**24, 400e-6), (2**28, 1.2e-3)]  # a knee: slow in the middle
    cluster = load_toml(_profile(tmp_path, {"collectives": {"send_recv/4": points}}))
    cal = cluster.calibration
    alpha, bw = cal.collective("send_recv", 4)
    mid = (2**24 + 2**28) / 2
    assert cal.collective_s("send_recv", 4, mid) == pytest.approx((400e-6 + 1.2e-3) / 2)
    assert cal.collective_s("send_recv", 4, 2**24) == pytest.approx(400e-6)
    assert cal.collective_s("send_recv", 4, 2**30) == pytest.approx(alpha + 2**30 / bw)  # past the last
    assert cal.collective_s("send_recv", 2, mid) is None  # not timed over 2
    links = _Links(Layout(tsp=4), replace(cluster, gpus_per_node=4))
    assert links.time_s(Comm("send_recv", "tsp", mid, 4, count=3)) == pytest.approx(3 * (400e-6 + 1.2e-3) / 2)


def test_profile_points_with_a_typo_are_named(tmp_path):
    path = _profile(tmp_path, {"collectives": {"all_reduce/2": [(2**20, 1e-5), (2**24, 1e-4)]}})
    path.write_text(path.read_text().replace("points = [[1048576", 'points = [["x"'))
    with pytest.raises(MeshplanError, match="points must be \\[message bytes, seconds\\] pairs"):
        load_toml(path)

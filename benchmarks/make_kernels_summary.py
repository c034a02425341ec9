"""Assemble benchmarks/results/kernels-h200.json (the kernels issue's figures) from the committed raw
kernel benchmarks, each of which names the command that made it.

    python benchmarks/make_kernels_summary.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def kernel_fraction(ssd: dict, run: dict, direction: str) -> float:
    """The scan's kernels' bytes over their summed profiled time, as a fraction of the copy rate: every
    scan kernel's time counts, one whose bytes the benchmark does not count (a segmented passing's
    join) included; torch's small ops around them ("other") do not."""
    ks = [v for k, v in run["kernels"][direction].items() if k != "other"]
    return sum(v.get("bytes", 0) for v in ks) / sum(v["s"] for v in ks) / ssd["copy_bytes_per_s"]


# The H200 preset's rated HBM rate (meshplan/topologies presets: the datasheet's 4.8 TB/s), the unit the
# cost model's fractions are in, and its multiprocessors (meshplan.costmodel.blocks.mamba2.SCAN_PASS_SMS).
H200_RATED_HBM = 4.8e12
H200_SMS = 132


def scan_model(ssd: dict) -> dict:
    """The cost model's scan constants (meshplan/costmodel/blocks/mamba2.py) from the benchmark's three
    shapes. A state passing is bound by its programs' issue, not by HBM: each program (a row, head and
    state tile: meshplan.kernels.launch.pass_programs) takes its row's chunks in turn, so a passing takes
    steps · max(latency, ⌈programs / SMs⌉ · issue) — one program alone on an SM pays the step's
    latency; several share its issue slots. The latency comes from the 40-head shape (80 programs, one
    an SM), the issue time from 16K × 80 heads (160 programs, two on some SMs), and 4 × 4K (640, five)
    is the check. Each shape's time is the mean of its three passings (forward, the backward's
    recompute, the backward's own), each with the kernel that forms its weights. The chunk kernels:
    bytes over profiled time on the first shape."""
    from meshplan.kernels.launch import pass_programs

    pts = []
    for run in ssd["runs"]:
        fwd, bwd = run["kernels"]["forward"], run["kernels"]["backward"]
        w = "_chunk_weights_kernel"  # each passing's weights, formed before it (the backward's two together)
        t = (
            fwd[w]["s"]
            + fwd["_state_passing"]["s"]
            + bwd[w]["s"]
            + bwd["_state_passing"]["s"]
            + bwd["_state_passing_bwd"]["s"]
        ) / 3
        per_sm = math.ceil(pass_programs(run["b"], run["heads"], run["headdim"], run["d_state"]) / H200_SMS)
        pts.append((-(-run["s"] // run["chunk"]), per_sm, t))
    (n0, k0, t0), (n1, k1, t1), (n2, k2, t2) = pts
    assert (k0, k1, k2) == (2, 5, 1)
    latency, issue = t2 / n2, t0 / (n0 * k0)
    r = ssd["runs"][0]
    fwd, bwd = r["kernels"]["forward"], r["kernels"]["backward"]
    chunks = [bwd["_chunk_bwd_dx"], bwd["_chunk_bwd_dbc"]]
    return {
        "SCAN_PASS_STEP_LATENCY_S": latency,
        "SCAN_PASS_STEP_ISSUE_S": issue,
        "check_4x4k_s": {"predicted": n1 * max(latency, k1 * issue), "measured": t1},
        "SCAN_FWD_HBM_FRACTION": fwd["_chunk_scan"]["bytes"] / fwd["_chunk_scan"]["s"] / H200_RATED_HBM,
        "SCAN_BWD_HBM_FRACTION": sum(k["bytes"] for k in chunks) / sum(k["s"] for k in chunks) / H200_RATED_HBM,
    }


def sp_correction(bench: dict) -> dict:
    """The SP correction kernels (meshplan/kernels/shard_state.py) on the 256K-token shard: each kernel's
    fraction of the rated HBM rate (the cost model's constants), and against the torch ops they replace."""
    r = max(bench["runs"], key=lambda x: x["shape"][1])
    names = {
        "_entering_fwd": "SP_CORRECTION_FWD_HBM_FRACTION",
        "_entering_bwd_dc": "SP_CORRECTION_DC_HBM_FRACTION",
        "_entering_bwd_de": "SP_CORRECTION_DE_HBM_FRACTION",
    }
    consts = {c: r["kernels"][k]["bytes"] / r["kernels"][k]["s"] / H200_RATED_HBM for k, c in names.items()}
    err = bench["rel_err_vs_fp64"]
    return {
        "sp_correction_cost_model_constants": consts,
        "sp_correction_speedup_over_torch": {"forward": r["forward_speedup"], "forward_backward": r["train_speedup"]},
        "sp_correction_note": (
            f"a Mamba-2 sequence shard's correction for its entering state, {r['shape'][1]} tokens x 80 heads of "
            f"64, d_state 128, bf16: forward {r['forward_s'] * 1e3:.2f} ms against {r['torch_forward_s'] * 1e3:.2f} "
            f"ms of torch ops, forward + backward {r['train_s'] * 1e3:.2f} against {r['torch_train_s'] * 1e3:.2f} "
            f"ms; kernels at "
            + ", ".join(
                f"{k.strip('_')} {v['bandwidth_fraction']:.0%}" for k, v in r["kernels"].items() if "bytes" in v
            )
            + f" of the copy roofline ({bench['copy_bytes_per_s'] / 1e12:.2f} TB/s). Relative error against "
            f"float64 at most {max(err.values()):.1e}. Source: shard-state-h200.json; settings: "
            f"entering-settings-ab-h200.json"
        ),
    }


def kt(run: dict, direction: str) -> float:
    """A conv run's kernel time (torch.profiler) in one direction."""
    return run["kernels_s"][direction]["_conv_fwd_march" if direction == "forward" else "_conv_bwd_march"]


def main() -> int:
    ssd, conv = load("ssd-h200.json"), load("conv1d-kernels-h200-r1.json")
    conv_r2 = load("conv1d-kernels-h200-r2.json")["runs"][0]
    # The committed code in three interleaved rounds against the kernels before it, on another H200.
    ab = [x for x in load("conv1d-fast-silu-ab3-h200.json")["rounds"] if x["seq_idx"] == "seq_idx"]
    ab_new = [x for x in ab if x["code"] == "new_defaults"]
    ab_old = [x for x in ab if x["code"] == "old"]
    pack, q, norm = load("packing-h200.json"), load("quant-allreduce-h200x2.json"), load("gated-norm-h200.json")
    # int8 against bf16 all-reduce at 16 MiB by link: NVLink (2 and 4 GPUs) and host memory (NCCL_P2P_DISABLE=1:
    # what GPUs without NVLink or peer-to-peer do), one call at a time.
    links = {
        "nvlink_2gpu": q,
        "nvlink_4gpu": load("quant-allreduce-h200x4.json"),
        "host_memory_2gpu": load("quant-allreduce-h200x2-host-memory.json"),
        "host_memory_4gpu": load("quant-allreduce-h200x4-host-memory.json"),
    }
    at16 = {k: next(x for x in v["allreduce"] if x["mib_bf16"] == 16) for k, v in links.items()}
    prefill = {k: v["tpssm_prefill"]["speedup"] for k, v in links.items()}
    # Two ranks over NVLink take the peer-mapped path (meshplan/executor/peer.py): two runs of one code on
    # one machine; the key holds the lower.
    peer_runs = [load(f) for f in ("quant-allreduce-peer-h200x2.json", "quant-allreduce-peer-h200x2-r2.json")]
    peer16 = [next(x for x in v["allreduce"] if x["mib_bf16"] == 16) for v in peer_runs]
    peer_key = min(peer16, key=lambda x: x["speedup_int8_peer"])
    r, c0, c1 = ssd["runs"][0], conv["runs"][0], conv["runs"][1]
    q256 = next(x for x in q["allreduce"] if x["mib_bf16"] == 256)
    dec = next(x for x in conv["decode"] if x["b"] == 8)
    grads = ssd["gradient_rel_err_vs_fp64"]
    out = {
        "scan_bandwidth_fraction": kernel_fraction(ssd, r, "forward"),
        "scan_backward_bandwidth_fraction": kernel_fraction(ssd, r, "backward"),
        "scan_call_bandwidth_fractions": {
            "forward": r["bandwidth_fraction"],
            "backward": r["backward_bandwidth_fraction"],
        },
        "scan_kernel_bandwidth_fractions": {
            d: {k.strip("_"): v["bandwidth_fraction"] for k, v in ks.items() if "bandwidth_fraction" in v}
            for d, ks in r["kernels"].items()
        },
        "scan_cost_model_constants": scan_model(ssd),
        "scan_note": (
            f"Triton chunked SSD, b 1, s 16384, 80 heads of 64, d_state 128, bf16, chunk 64: forward "
            f"{r['forward_s'] * 1e3:.2f} ms ({r['speedup_over_reference']:.1f}x the torch chunked reference), "
            f"backward {r['backward_s'] * 1e3:.2f} ms; forward+backward {r['train_speedup_over_reference']:.1f}x "
            f"autograd through the reference (1.69 and 5.86 ms with fp32 operands, one program per head: "
            f"ssd-h200.json at commit 0fd0ed8; steps between: ssd-bf16-forward-h200.json, "
            f"ssd-bf16-operands-h200.json, ssd-head-loops-h200.json, ssd-bwd-dbc-ab-h200.json; the dx kernel: "
            f"ssd-dx-ablation-h200.json, ssd-bwd-rowsums2-ab-h200.json, and variants not kept: "
            f"ssd-dx-strips-ab-h200.json, ssd-bwd-split-ddt-ab-h200.json, ssd-bwd-rowsums-ab-h200.json). Relative "
            f"error against float64: output {r['rel_err_vs_fp64']:.1e}, gradients "
            f"{max(grads['plain'].values()):.1e} at most (packed rows {max(grads['packed_every_700'].values()):.1e}). "
            f"Fractions of the measured copy roofline ({ssd['copy_bytes_per_s'] / 1e12:.2f} TB/s): the scan's "
            f"kernels' HBM traffic (meshplan.costmodel.blocks.mamba2.ssd_kernel_bytes) over their profiled time "
            f"(scan_bandwidth_fraction, and per kernel), and over the whole call's time, launch gaps and small "
            f"torch ops included (scan_call_bandwidth_fractions). The chunk states are formed inside the "
            f"sequential state passing, which stores only the bf16 states the chunk kernels read: at the "
            f"commit before (38428aa) a chunk-state kernel wrote fp32 states and the passing read them back, "
            f"and the kernels ran at 79% / 66% of the copy roofline moving 2.1x / 1.7x these bytes, in "
            f"0.77 / 2.30 ms of kernel time (ssd-fused-passing-ab-h200.json); a small kernel forms each "
            f"passing's weights before it (ssd-pass-weights-ab-h200.json). The passing is bound by its "
            f"programs' instruction issue in its sequential steps (ncu-state-passing-h200.txt), not by HBM, "
            f"so the fractions fell while the time did too. Source: ssd-h200.json; launch settings: "
            f"ssd-pass-tune-h200.json, "
            f"ssd-fwd-tune-h200.json, ssd-bwd-tune-h200.json, ssd-head-loops-h200.json; grid order: "
            f"ssd-grid-order-h200.json"
        ),
        "conv_bandwidth_fraction": c0["fwd_kernel_bandwidth_fraction"],
        "conv_backward_bandwidth_fraction": c0["bwd_kernel_bandwidth_fraction"],
        "conv_call_bandwidth_fractions": {
            "forward": c0["fwd_bandwidth_fraction"],
            "backward": c0["bwd_bandwidth_fraction"],
        },
        "conv_note": (
            f"time-marching kernels, four rows a step, b 4, t 16384, 5376 channels, bf16, packed rows "
            f"(seq_idx, a new sequence every 1000 tokens): forward (128 rows x 128 channels a program, "
            f"1 warp) kernel {kt(c0, 'forward') * 1e3:.3f} ms; backward (one pass, 256 x 256, 2 warps, rows "
            f"loaded a step ahead, 168 registers a thread) kernel {kt(c0, 'backward') * 1e3:.3f} ms, its "
            f"fp32 dw, db partial sums counted with its bytes; the run after it on the same machine "
            f"{kt(conv_r2, 'forward') * 1e3:.3f} / {kt(conv_r2, 'backward') * 1e3:.3f} ms "
            f"({conv_r2['fwd_kernel_bandwidth_fraction']:.0%} / {conv_r2['bwd_kernel_bandwidth_fraction']:.0%}). "
            f"As the scan's, these fractions are of the kernels' profiled times. A whole call timed alone "
            f"(CUDA events around it) took {c0['fwd_s'] * 1e3:.3f} / {c0['bwd_s'] * 1e3:.3f} ms "
            f"(conv_call_bandwidth_fractions; {conv_r2['fwd_s'] * 1e3:.3f} / {conv_r2['bwd_s'] * 1e3:.3f} ms "
            f"in the second run): the GPU waits for the host's launch, and the backward's torch ops (the "
            f"seq_idx cast, the dw and db partial sums) take {c0['kernels_s']['backward']['other'] * 1e3:.3f} ms. "
            f"The backward was 4.46 ms at the start of this work, 2.54 ms two-pass with tuned tiles, 1.14-1.25 "
            f"ms a call before the cheaper sigmoid and the unmasked steps (conv1d-fast-silu-ab3-h200.json, "
            f"three interleaved rounds on another H200, calls: forward "
            f"{min(x['fwd_frac'] for x in ab_new):.0%}-{max(x['fwd_frac'] for x in ab_new):.0%}, backward "
            f"{min(x['bwd_frac'] for x in ab_new):.0%}-{max(x['bwd_frac'] for x in ab_new):.0%} of that "
            f"machine's copy roofline, against {min(x['fwd_frac'] for x in ab_old):.0%}-"
            f"{max(x['fwd_frac'] for x in ab_old):.0%} and {min(x['bwd_frac'] for x in ab_old):.0%}-"
            f"{max(x['bwd_frac'] for x in ab_old):.0%} before). At b 1, t 65536, kernels: "
            f"{c1['fwd_kernel_bandwidth_fraction']:.0%} / {c1['bwd_kernel_bandwidth_fraction']:.0%}. Decode "
            f"update at batch 8: Triton {dec['triton_s'] * 1e6:.0f} us against {dec['torch_ops_s'] * 1e6:.0f} us "
            f"of torch ops. Source: conv1d-kernels-h200-r1.json (copy roofline "
            f"{conv['copy_bytes_per_s'] / 1e12:.2f} TB/s on that machine), -r2"
        ),
        "packed_over_padded_speedup": pack["packed_over_padded_speedup"],
        "packed_note": (
            f"mamba2-2.7b-shaped, 2 layers, bf16, training one epoch of 96 sequences "
            f"({pack['real_tokens']:,} real tokens, log-normal lengths, rows of 8192): padded "
            f"{pack['padded_epoch_s']:.2f} s vs packed {pack['packed_epoch_s']:.2f} s; padding inflates tokens "
            f"{pack['padding_overhead']:.2f}x. Triton conv and scan, forward and backward, with seq_idx. "
            f"Source: packing-h200.json"
        ),
        "int8_allreduce_speedup_16mib": {
            **{k: r["speedup"] for k, r in at16.items()},
            "nvlink_2gpu": peer_key["speedup_int8_peer"],
            "nvlink_2gpu_nccl_path": at16["nvlink_2gpu"]["speedup"],
        },
        "int8_peer_note": (
            "2 GPUs over NVLink, the peer-mapped path (the executor's choice there): bf16 NCCL / int8 "
            "at 16 MiB, one call at a time and back to back, two runs: "
            + "; ".join(
                f"{r['bf16_s'] * 1e3:.3f} / {r['int8_peer_s'] * 1e3:.3f} ms "
                f"({r['speedup_int8_peer']:.2f}x), back to back {r['speedup_int8_peer_back_to_back']:.2f}x, "
                f"host {r['int8_peer_host_s'] * 1e6:.0f} us a call"
                for r in peer16
            )
            + ". Other sizes, run by run: "
            + "; ".join(
                ", ".join(
                    f"{x['mib_bf16']} MiB {x['speedup_int8_peer']:.2f}x" for x in v["allreduce"] if x["mib_bf16"] != 16
                )
                for v in peer_runs
            )
            + " (at 1-4 MiB the host's 33-50 us a call sets the time, against NCCL's 35-90 us). "
            "Bit-equal to the NCCL int8 path (same rounding, same order of the sum). TP-SSM prefill "
            "(mamba2-2.7b, 4 layers, batch 4 x 16K): "
            + ", ".join(f"{v['tpssm_prefill']['speedup']:.2f}x" for v in peer_runs)
            + ". Sources: quant-allreduce-peer-h200x2.json (with --peer-tiles), "
            "quant-allreduce-peer-h200x2-r2.json; the host's launch costs: peer-probe-h200x2.json"
        ),
        "int8_note": (
            "bf16 / int8 time at 16 MiB of bf16 per link and GPU count, the NCCL int8 path: "
            + "; ".join(f"{k} {r['bf16_s'] * 1e3:.3f} / {r['int8_s'] * 1e3:.3f} ms" for k, r in at16.items())
            + f". 256 MiB over NVLink on 2: {q256['speedup']:.2f}x. NVLink moves 16 MiB faster than the "
            "int8 path's fixed cost (on 2 ranks one all-gather and 2 kernels, on more 2 collectives and 3 kernels, "
            "and Python); over host memory int8 wins from 16 MiB. "
            "TP-SSM prefill (mamba2-2.7b, 4 layers, batch 4 x 16K) int8 over bf16: "
            + ", ".join(f"{k} {v:.2f}x" for k, v in prefill.items())
            + ". Sources: quant-allreduce-h200x2.json, quant-allreduce-h200x4.json, "
            "quant-allreduce-h200x2-host-memory.json, quant-allreduce-h200x4-host-memory.json"
        ),
        "gated_norm_speedup_over_torch": norm["runs"][0]["speedup"],
        "gated_norm_note": (
            f"forward + backward, 16384 x 5120, one group: Triton "
            f"{norm['runs'][0]['triton_fwd_bwd_s'] * 1e3:.2f} ms against "
            f"{norm['runs'][0]['torch_fwd_bwd_s'] * 1e3:.2f} ms of torch ops. Source: gated-norm-h200.json"
        ),
        **sp_correction(load("shard-state-h200.json")),
        "command": "python benchmarks/make_kernels_summary.py (from the raw files named in each note; each names "
        "its command)",
    }
    (RESULTS / "kernels-h200.json").write_text(json.dumps(out, indent=1) + "\n")
    for k, v in out.items():
        if not k.endswith("note") and k != "command":
            print(f"{k}: {json.dumps(v, default=str) if isinstance(v, dict) else f'{v:.3f}'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Build benchmarks/results/validation-h200.json and docs/validation.png from committed raw runs.

    python benchmarks/make_validation_report.py

Raw runs (measured on lent H200s with benchmarks/gpu_validation.py; each file names its command):
- validation-h200-run70-x2-dense-decode-fix.json: run 69's grid with the decode prefill's input freed.
- validation-h200-run69-x2-dense-cudnn-attention.json: every dense layout of 2 GPUs (the grid of run 53)
  with the executor's attention through cuDNN (whole sequence, and a shard's prefix as two blocks merged
  by log-sum-exp); the dense SP and TSP rows of earlier runs ran the masked single-call shard attention
  the model no longer describes (their time errors grew when the tables were re-measured).
- validation-h200-run60-x2-norm-one-pass.json: every layout of 2 GPUs (the grid of run 53) with the
  one-pass gated RMSNorm and the fused SSD state passing; validation-h200-run62-x2-mamba2-long-conv-head.json:
  the final code at 128K-1M tokens (runs 59 and 61, the same grid before, ran a state passing whose
  offsets wrapped from 512K tokens: not in the report).
- validation-h200-run58-x2-pass-weights.json, validation-h200-run57-x2-fused-passing.json: every Mamba-2
  layout of 2 GPUs with the SSD scan's chunk states formed inside its state passing (run 58: the
  passing's weights from a kernel of their own); validation-h200-run59-x2-mamba2-long-fused-passing.json:
  run 58's code at 128K-1M tokens (before the one-pass norm). Mamba-2 rows of earlier runs (but decode)
  ran the scan before it and are left out (era_ok).
- validation-h200-run56-x2-conv-in-place.json: the same grid with the conv reading Mamba-2's xBC in
  place (and the model's Mamba-2 eager factor measured again).
- validation-h200-run54-x2-current.json, validation-h200-run55-x2-calibrated.json: the same grid as run
  53 with a later session's code (its faster SSD dx kernel) on two other 2 × H200 machines, the second
  right after `meshplan calibrate` (benchmarks/results/calibration-run55-h200-2gpu.toml).
- validation-h200-run53-x2-current.json: the current executor and kernels, every layout that fits 2
  GPUs (ZeRO 0-3 and PP included), training at 4K and 16K, prefill and decode at 16K.
- validation-h200-run52-x2-pp.json: the current executor with pipeline stages (pp=2) beside one GPU,
  training, prefill and decode. (Run 51, `…-pp-first.json`, is the same before inference steps waited
  for the last stage and before the memory model counted the stages' boundary tensors.)
- validation-h200-run50-x2-zero3.json: the current executor with ZeRO 3 (meshplan/executor/zero3.py)
  beside ZeRO 2 and one GPU. (Run 49, `…-zero3-leak.json`, is the same before its hooks held the
  layers weakly.)
- validation-h200-run48-x2-zero.json: the current executor with ZeRO 1 and 2 (optim.ZeroAdam), beside
  ZeRO 0 and one GPU, dense and Mamba-2 training at 4K and 16K.
- validation-h200-run47-x2-dp-sp-overlap.json: the current executor, whose gradient all-reduces (dp, and
  SP's replicated weights) start from hooks as each gradient is ready, behind the backward; one GPU,
  dp=2 and sp=2, dense and Mamba-2 training at 4K and 16K.
- validation-h200-run37-x2-current.json: the current executor and kernels, every layout at degree 1
  and 2, training, prefill and decode, profiled (the first line of benchmarks/sweeps/h200x2-profiled.sh).
- validation-h200-run36-x2-dense-sp-zigzag.json: dense SP dealing its tokens in zigzag (the runs
  before it ran SP contiguous, which the model no longer describes for attention-only stacks).
- validation-h200-run34/run35-x2-{mamba2,dense}-*.json: today's executor and kernels, training at 4K and
  16K on two 2 × H200 machines, each after a `meshplan calibrate` on the same machine
  (benchmarks/sweeps/calibrated-host.sh 2; the profiles are benchmarks/results/calibration-run3*.toml).
- validation-h200-run33-x4-mamba2-current.json: today's kernels, Mamba-2 training at 16K on 4 × H200,
  one GPU, TP-SSM 2 and 4, SP 2 and 4 (benchmarks/sweeps/h200x4.sh f).
- validation-h200-run20-x4-current.json: the current executor (Triton RMSNorm, time-marching conv1d
  backward) on 4 × H200, every layout at degree 1, 2, 4, dense and Mamba-2, training, prefill, decode.
- validation-h200-run17-x4-triton-norm.json: the same grid before the conv1d backward marched
  (benchmarks/sweeps/h200x4.sh d).
- memory-curves-4xh200-run18-triton-norm.json: dense training at 16K-256K tokens on 4 × H200, TP,
  TSP, SP and TP+SP (the memory curves; two timed steps each).
- validation-h200-run14-x4.json: the same grid before the executor's RMSNorm went to Triton (its
  torch backward held five fp32 copies of a full-sequence activation under TP).
- validation-h200-run3-x2.json: the current executor, 2 × H200 (world 1 and 2).
- validation-h200-run5-x2-inference.json: the current executor, prefill and decode (batch 8 after a
  16K prefill), 2 × H200. (run4 is the same sweep before the decode cache was preallocated.)
- validation-h200-run1.json: 4 × H200 (world 1, 2, 4) with the first executor (attention through
  a dense boolean mask, unfused optimizer). Its byte counts and saved activations still stand; its
  memory and times describe that older executor and are reported separately.
- validation-h200-run11-x2-mamba2.json: the current executor's Mamba-2 path (Triton conv, SSD scan
  and gated RMSNorm, forward and backward, with their tuned launch settings; SP with all-gathered
  shard summaries), 2 × H200, training and prefill. Its Mamba-2 runs replace those of run3 and run5,
  which ran the torch reference scan.
- validation-h200-run10-x2-mamba2-fused-norm.json: the same before the conv backward and scan
  forward settings were tuned.
- validation-h200-run12-x2-mamba2-long.json and run13 (…-long-expandable.json): Mamba-2 training at
  128K to 1M tokens, one step each, up to the largest that fits; run13 with expandable allocator
  segments, which the executor now sets.
- validation-h200-run9-x2-mamba2.json: the same before the Triton gated norm, with decode.
Predictions are recomputed from the current cost model.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from compare_validation import rescore

HERE = Path(__file__).parent
RESULTS = HERE / "results"
DOCS = HERE.parent / "docs"
SOURCES = [
    (
        "validation-h200-run67-x2-mamba2-tsp.json",
        "TSP over Mamba-2 blocks (meshplan/executor/layouts/tsp_mamba.py), tsp=2: training at 4K and 16K, "
        "prefill and decode at 16K, 2 x H200",
    ),
    (
        "validation-h200-run68-x2-mamba2-tsp-long.json",
        "the code of run 67: TSP 2 Mamba-2 training at 128K and 512K tokens, 2 x H200",
    ),
    (
        "validation-h200-run64-x2-mamba2-sp-correction-cat.json",
        "a Mamba-2 sequence shard's correction for its entering state as Triton kernels, and the in_proj "
        "output's gradient joined a block of rows at a time (cat_last): SP training at 16K-1M tokens and "
        "prefill at 16K and 128K, 2 x H200",
    ),
    (
        "validation-h200-run70-x2-dense-decode-fix.json",
        "the code of run 69 with the decode prefill's input freed (measure kept it through the decode steps "
        "since commit bf7185d: 1 GiB at batch 8, 16K), every dense layout of 2 GPUs (as run 53), 2 x H200",
    ),
    (
        "validation-h200-run69-x2-dense-cudnn-attention.json",
        "the executor's attention through cuDNN in every layout (meshplan/executor/attention.py: whole-sequence "
        "SDPA with cuDNN first, a shard's prefix as two fused blocks merged by log-sum-exp), every dense layout of "
        "2 GPUs (as run 53), 2 x H200; the model's attention tables re-measured on the same paths "
        "(attention-paths-h200.json)",
    ),
    (
        "validation-h200-run65-x2-mamba2-long-cat.json",
        "the code of run 64: one GPU and TP-SSM training at 128K and 512K tokens, 2 x H200",
    ),
    ("validation-h200-run66-x2-mamba2-tpssm-1m-cat.json", "the code of run 64: TP-SSM training at 1M tokens, 2 x H200"),
    (
        "validation-h200-run62-x2-mamba2-long-conv-head.json",
        "the final code at 128K-1M tokens (the state passing's offsets in int64, the sequence shard's conv "
        "without a copy): one GPU, TP-SSM and SP, 2 x H200",
    ),
    (
        "validation-h200-run60-x2-norm-one-pass.json",
        "the final code of the session that added runs 57-60 (the SSD scan's fused state passing, the "
        "one-pass gated RMSNorm): every layout of 2 GPUs (as run 53), 2 x H200",
    ),
    (
        "validation-h200-run59-x2-mamba2-long-fused-passing.json",
        "the SSD scan of run 58 at 128K-1M tokens: one GPU, TP-SSM and SP, 2 x H200",
    ),
    (
        "validation-h200-run58-x2-pass-weights.json",
        "the SSD scan's chunk states formed inside its state passing, each passing's weights by a kernel "
        "before it: every Mamba-2 layout of 2 GPUs (as run 53), 2 x H200",
    ),
    (
        "validation-h200-run57-x2-fused-passing.json",
        "the SSD scan's chunk states formed inside its state passing (weights in the loop): every Mamba-2 "
        "layout of 2 GPUs (as run 53), 2 x H200",
    ),
    (
        "validation-h200-run56-x2-conv-in-place.json",
        "the conv reading Mamba-2's xBC in place and the model's Mamba-2 eager factor re-measured, every "
        "layout of 2 GPUs (as run 53), 2 x H200",
    ),
    (
        "validation-h200-run55-x2-calibrated.json",
        "the code between runs 53 and 56, every layout of 2 GPUs (as run 53), on a machine calibrated just before "
        "(benchmarks/results/calibration-run55-h200-2gpu.toml; predicted here with the preset), 2 x H200",
    ),
    (
        "validation-h200-run54-x2-current.json",
        "the code between runs 53 and 56, every layout of 2 GPUs (as run 53), on another 2 x H200",
    ),
    (
        "validation-h200-run53-x2-current.json",
        "current executor and kernels (this session's final code), every layout of 2 GPUs — TP, SP, TSP, TP-SSM, "
        "DP with ZeRO 0-3, PP — beside one GPU, training at 4K and 16K, prefill and decode at 16K, 2 x H200",
    ),
    (
        "validation-h200-run52-x2-pp.json",
        "current executor and kernels, pipeline stages (pp=2, 1F1B over 8 micro-batches) beside one GPU, dense "
        "and Mamba-2 training at 4K and 16K, prefill and decode at 16K, 2 x H200",
    ),
    (
        "validation-h200-run50-x2-zero3.json",
        "current executor and kernels, ZeRO 3 (weights gathered around each layer's forward and backward) "
        "beside ZeRO 2 and one GPU, dense and Mamba-2 training at 4K and 16K, prefill and decode on one GPU, "
        "2 x H200",
    ),
    (
        "validation-h200-run48-x2-zero.json",
        "current executor and kernels, ZeRO 1 and 2 (sharded Adam, gradients reduce-scattered behind the "
        "backward) against ZeRO 0 and one GPU, dense and Mamba-2 training at 4K and 16K, 2 x H200",
    ),
    (
        "validation-h200-run47-x2-dp-sp-overlap.json",
        "current executor and kernels (gradient all-reduces started from hooks as each weight's gradient is "
        "ready, behind the backward), one GPU, dp=2 and sp=2, dense and Mamba-2 training at 4K and 16K, 2 x H200",
    ),
    (
        "validation-h200-run43-x2-mamba2-sp-one-scan.json",
        "current executor and kernels (SP Mamba-2 scans once a shard; this session's final code), Mamba-2 "
        "training 4K-16K and prefill 16K, one GPU and SP 2, 2 x H200",
    ),
    (
        "validation-h200-run45-x2-dp.json",
        "data parallelism (dp=2, ZeRO 0) with one all-reduce of every gradient after the backward (before "
        "GradientSync), dense and Mamba-2 training at 4K and 16K, 2 x H200",
    ),
    (
        "validation-h200-run43-x2-mamba2-long-sp-one-scan.json",
        "current executor and kernels, SP 2 Mamba-2 training 128K-1M tokens, 2 x H200",
    ),
    (
        "validation-h200-run41-x2-mamba2-sp-one-scan.json",
        "SP Mamba-2 scanning once a shard, with the scan's graph kept in backward (before its conv-output "
        "gradient was assembled in one tensor), Mamba-2 training 4K-32K and prefill 16K, one GPU and SP 2, "
        "profiled, 2 x H200",
    ),
    (
        "validation-h200-run37-x2-current.json",
        "current executor and kernels (this session's final code), every layout at degree 1 and 2, training, "
        "prefill, decode, profiled, 2 x H200",
    ),
    (
        "validation-h200-run36-x2-dense-sp-zigzag.json",
        "current executor and kernels, SP dealing its tokens in zigzag; dense degrees 1-2, 2 x H200",
    ),
    (
        "validation-h200-run30-x2-fewer-launches.json",
        "current executor and kernels (four-rows-a-step conv reading its taps as they are, the scan's decay "
        "sums from its chunk-state kernel, no host syncs), degrees 1-2, profiled, 2 x H200",
    ),
    (
        "validation-h200-run31-x2-mamba2-long-current.json",
        "current executor and kernels, Mamba-2 training 128K-1M tokens, 2 x H200",
    ),
    (
        "validation-h200-run35-x2-mamba2-calibrated-host.json",
        "current executor and kernels, Mamba-2 training at 4K and 16K, degrees 1-2, 2 x H200",
    ),
    (
        "validation-h200-run35-x2-dense-calibrated-host.json",
        "current executor and kernels, dense training at 4K and 16K, degrees 1-2, 2 x H200",
    ),
    (
        "validation-h200-run34-x2-mamba2-host-probe.json",
        "current executor and kernels, Mamba-2 training at 4K and 16K, degrees 1-2, another 2 x H200",
    ),
    (
        "validation-h200-run34-x2-dense-host-probe.json",
        "current executor and kernels, dense training at 4K and 16K, degrees 1-2, another 2 x H200",
    ),
    (
        "validation-h200-run33-x4-mamba2-current.json",
        "current executor and kernels (the conv's cheaper sigmoid and unmasked steps), Mamba-2 training at 16K, "
        "degrees 1, 2, 4, 4 x H200",
    ),
    (
        "validation-h200-run28-x2-profiled-optimizer-fix.json",
        "the same with 20 more launches a Mamba-2 layer and dense SP's host sync, degrees 1-2, profiled, 2 x H200",
    ),
    (
        "validation-h200-run20-x4-current.json",
        "current executor for dense; Mamba-2 with the fp32-buffer scan (before 7e3a361), 4 x H200",
    ),
    ("validation-h200-run23-x2-mamba2-bf16-scan.json", "current executor, Mamba-2, 2 x H200"),
    (
        "validation-h200-run24-x2-mamba2-long-bf16-scan.json",
        "current executor, Mamba-2 training 128K-1M tokens, 2 x H200",
    ),
    ("validation-h200-run17-x4-triton-norm.json", "before the marching conv1d backward, 4 x H200"),
    ("memory-curves-4xh200-run18-triton-norm.json", "current executor, dense training 16K-256K, 4 x H200"),
    ("validation-h200-run14-x4.json", "before the Triton RMSNorm, 4 x H200"),
    ("validation-h200-run3-x2.json", "executor before the Triton RMSNorm, 2 x H200"),
    ("validation-h200-run11-x2-mamba2.json", "Mamba-2 with Triton kernels, fp32-buffer scan, 2 x H200"),
    ("validation-h200-run10-x2-mamba2-fused-norm.json", "Mamba-2 before the last kernel tuning, 2 x H200"),
    ("validation-h200-run12-x2-mamba2-long.json", "Mamba-2 training 128K-1M tokens, fp32-buffer scan, 2 x H200"),
    (
        "validation-h200-run13-x2-mamba2-long-expandable.json",
        "Mamba-2 training 512K-1M tokens, expandable allocator segments, fp32-buffer scan, 2 x H200",
    ),
    ("validation-h200-run9-x2-mamba2.json", "Mamba-2 before the Triton gated norm (decode from here), 2 x H200"),
    ("validation-h200-run5-x2-inference.json", "current executor, prefill and decode, 2 x H200"),
    ("validation-h200-run1.json", "first executor (masked attention, unfused optimizer), 4 x H200"),
]
# Model families a source speaks for: run3 and run5 ran Mamba-2 on the torch reference scan, since
# replaced (run9); so did run1, whose SP Mamba-2 also handed the state along a serial chain.
FAMILIES = {
    "validation-h200-run3-x2.json": ("dense",),
    "validation-h200-run41-x2-mamba2-sp-one-scan.json": ("mamba2",),
    "validation-h200-run43-x2-mamba2-sp-one-scan.json": ("mamba2",),
    "validation-h200-run43-x2-mamba2-long-sp-one-scan.json": ("mamba2",),
    "validation-h200-run23-x2-mamba2-bf16-scan.json": ("mamba2",),
    "validation-h200-run24-x2-mamba2-long-bf16-scan.json": ("mamba2",),
    "validation-h200-run31-x2-mamba2-long-current.json": ("mamba2",),
    "validation-h200-run33-x4-mamba2-current.json": ("mamba2",),
    "validation-h200-run35-x2-mamba2-calibrated-host.json": ("mamba2",),
    "validation-h200-run35-x2-dense-calibrated-host.json": ("dense",),
    "validation-h200-run36-x2-dense-sp-zigzag.json": ("dense",),
    "validation-h200-run34-x2-mamba2-host-probe.json": ("mamba2",),
    "validation-h200-run34-x2-dense-host-probe.json": ("dense",),
    "validation-h200-run5-x2-inference.json": ("dense",),
    "validation-h200-run11-x2-mamba2.json": ("mamba2",),
    "validation-h200-run10-x2-mamba2-fused-norm.json": ("mamba2",),
    "validation-h200-run12-x2-mamba2-long.json": ("mamba2",),
    "validation-h200-run13-x2-mamba2-long-expandable.json": ("mamba2",),
    "validation-h200-run9-x2-mamba2.json": ("mamba2",),
    "validation-h200-run1.json": ("dense",),
}


def era_ok(name: str, row: dict) -> bool:
    """Whether a source's row ran code the current model describes. Before run 40 a Mamba-2 sequence
    shard scanned twice (its zero-start summary, then its outputs from the entering state); since, it
    scans once and corrects its outputs. Before run 57 the SSD scan wrote fp32 chunk states that its
    state passing read back (up to a tenth of a long-context step's peak); before run 60 the gated
    RMSNorm took two passes a direction and copied z (the model's Mamba-2 eager factor and norm phase
    are run 60's). Mamba-2 rows that ran older code (every mode but decode, which uses neither) are left
    out of the report; docs/validation.md keeps what they showed."""
    m = re.search(r"run(\d+)", name)
    run = int(m.group(1)) if m is not None else None
    if run is None or not row["model"].startswith("mamba2"):
        return True
    two_scans = run < 40 and "sp=" in row["layout"]
    older_kernels = run < 60 and row["mode"] != "decode"
    # Since run 64 a sequence shard's correction runs as Triton kernels (the model's sp_correction_s and
    # norm phase describe them), and the in_proj output's gradient is joined in blocks of rows: past 2^31
    # elements torch's one cat had fallen to a strided copy per part.
    torch_correction = run < 64 and "sp=" in row["layout"] and row["mode"] != "decode"
    one_cat = run < 64 and row["mode"] == "train" and _in_proj_grad_elements(row) >= 2**31
    return not (two_scans or older_kernels or torch_correction or one_cat)


def _in_proj_grad_elements(row: dict) -> float:
    """Elements of one rank's Mamba-2 in_proj output (its gradient is what the backward joins)."""
    from meshplan.layout import parse_layout
    from meshplan.models import PRESETS

    m = PRESETS[row["model"].split("/")[0]].mamba2
    lay = parse_layout(row["layout"])
    t = lay.tpssm
    groups = m.ngroups // t if m.ngroups % t == 0 else m.ngroups
    width = 2 * m.d_inner / t + 2 * groups * m.d_state + m.nheads / t
    return row["seq"] * row.get("batch", 1) / max(lay.sp, 1) * width


def main() -> int:
    runs = []
    for name, what in SOURCES:
        for row in rescore(str(RESULTS / name)):
            if not row["model"].startswith(FAMILIES.get(name, ("dense", "mamba2"))) or not era_ok(name, row):
                continue
            p, m = row["predicted"], row["measured"]
            runs.append(
                {
                    "layout": row["layout"],
                    "model": row["model"],
                    "seq": row["seq"],
                    "mode": row["mode"],
                    "source": name,
                    "executor": what,
                    "predicted": {
                        "peak_bytes": p["peak_bytes"],
                        "comm_bytes": sum(p["comm_bytes"].values()),
                        "step_time_s": p["step_time_s"],
                        "exposed_comm_s": p["exposed_comm_s"],
                        "comm_bytes_by_kind": p["comm_bytes"],
                        "saved_bytes": p.get("saved_bytes"),
                    },
                    "measured": {
                        "peak_bytes": m["peak_bytes"],
                        "comm_bytes": sum(m["comm_bytes"].values()),
                        "step_time_s": m["step_time_s"],
                        "exposed_comm_s": m.get("exposed_comm_s"),
                        "comm_bytes_by_kind": m["comm_bytes"],
                        "saved_bytes": m.get("saved_bytes"),
                    },
                    "comm_bytes_exact": row["comm_bytes_exact"],
                }
            )
    out = {"command": "python benchmarks/make_validation_report.py", "sources": dict(SOURCES), "runs": runs}
    (RESULTS / "validation-h200.json").write_text(json.dumps(out, indent=1) + "\n")
    summary = summarize(runs)
    (RESULTS / "validation-h200-summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(runs)
    for line in summary["lines"]:
        print(line)
    return 0


def _err(run, key):
    return run["measured"][key] / run["predicted"][key] - 1


def summarize(runs: list[dict]) -> dict:
    lines = []
    out = {}
    for source, _ in SOURCES:
        for fam, modes in (
            ("dense", ("train", "prefill")),
            ("dense", ("decode",)),
            ("mamba2", ("train", "prefill")),
            ("mamba2", ("decode",)),
        ):
            sub = [r for r in runs if r["source"] == source and r["model"].startswith(fam) and r["mode"] in modes]
            if not sub:
                continue
            mem = [abs(_err(r, "peak_bytes")) for r in sub]
            tim = [abs(_err(r, "step_time_s")) for r in sub]
            saved = [
                abs(r["measured"]["saved_bytes"] / r["predicted"]["saved_bytes"] - 1)
                for r in sub
                if r["mode"] == "train" and r["predicted"]["saved_bytes"]
            ]
            key = f"{source}:{fam}:{'+'.join(modes)}"
            out[key] = {
                "runs": len(sub),
                "bytes_exact": sum(r["comm_bytes_exact"] for r in sub),
                "memory_abs_err_median": statistics.median(mem),
                "memory_abs_err_max": max(mem),
                "memory_within_5pct": sum(e <= 0.05 for e in mem),
                "time_abs_err_median": statistics.median(tim),
                "time_abs_err_max": max(tim),
                "time_within_15pct": sum(e <= 0.15 for e in tim),
                "saved_abs_err_max": max(saved) if saved else None,
            }
            s = out[key]
            saved_text = (
                f", saved activations max |err| {s['saved_abs_err_max']:.2%}"
                if s["saved_abs_err_max"] is not None
                else ""
            )
            lines.append(
                f"{key}: {s['runs']} runs, bytes exact {s['bytes_exact']}/{s['runs']}, memory |err| median "
                f"{s['memory_abs_err_median']:.1%} max {s['memory_abs_err_max']:.1%} "
                f"({s['memory_within_5pct']} within 5%), time |err| median {s['time_abs_err_median']:.1%} "
                f"max {s['time_abs_err_max']:.1%} ({s['time_within_15pct']} within 15%){saved_text}"
            )
    out["lines"] = lines
    return out


def plot(runs: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The dense runs of the first source that has any.
    source = next(
        name for name, _ in SOURCES if any(r["source"] == name and r["model"].startswith("dense") for r in runs)
    )
    current = [r for r in runs if r["source"] == source and r["model"].startswith("dense")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for ax, key, scale, unit in ((axes[0], "peak_bytes", 2**30, "GiB"), (axes[1], "step_time_s", 1e-3, "ms")):
        for layout in sorted({r["layout"] for r in current}):
            pts = [(r["predicted"][key] / scale, r["measured"][key] / scale) for r in current if r["layout"] == layout]
            ax.scatter([p for p, _ in pts], [m for _, m in pts], label=layout, s=28)
        hi = max(max(r["predicted"][key], r["measured"][key]) for r in current) / scale * 1.08
        ax.plot([0, hi], [0, hi], color="grey", linewidth=1, label="y = x")
        if key == "peak_bytes":
            ax.fill_between([0, hi], [0, hi * 0.95], [0, hi * 1.05], color="grey", alpha=0.12, label="±5%")
        else:
            ax.fill_between([0, hi], [0, hi * 0.85], [0, hi * 1.15], color="grey", alpha=0.12, label="±15%")
        ax.set_xlabel(f"predicted ({unit})")
        ax.set_ylabel(f"measured ({unit})")
        ax.set_title({"peak_bytes": "peak memory per GPU", "step_time_s": "step time"}[key])
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"dense-7b shape, 2 layers, bf16, H200s (benchmarks/results/{source})")
    fig.tight_layout()
    DOCS.mkdir(exist_ok=True)
    fig.savefig(DOCS / "validation.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())

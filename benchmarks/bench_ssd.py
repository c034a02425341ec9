"""Triton chunked SSD scan on one GPU, forward and backward: accuracy against float64 references,
time against the torch chunked reference, and achieved bandwidth against the copy roofline, whole and
kernel by kernel.

    python benchmarks/bench_ssd.py --out $OUT/ssd.json [--chunk 64]

Bytes are what each kernel reads and writes in HBM, as the cost model counts them
(meshplan.costmodel.blocks.mamba2.ssd_kernel_bytes); per-kernel times come from torch.profiler over a few
calls.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from meshplan.costmodel.blocks.mamba2 import ssd_kernel_bytes
from meshplan.executor.run import copy_roofline_bytes_per_s, kernel_times, median_time_s
from meshplan.kernels import launch, ssd_bwd
from meshplan.kernels.reference import ssd_chunked_ref
from meshplan.kernels.ssd_combined import ssd_chunked

FWD_KERNELS = ("_chunk_weights_kernel", "_state_passing", "_join_segments", "_chunk_scan")
BWD_KERNELS = (
    "_chunk_weights_kernel",
    "_state_passing",
    "_state_passing_bwd",
    "_join_segments",
    "_chunk_bwd_dx",
    "_chunk_bwd_dbc",
)

SHAPES = ((1, 16384, 80, 64, 1, 128), (4, 4096, 80, 64, 1, 128), (1, 16384, 40, 64, 1, 128))


def inputs(b, s, h, p, g, n, seed=0, grad=False):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(b, s, h, p, device="cuda", dtype=torch.bfloat16, generator=gen)
    dt = F.softplus(torch.randn(b, s, h, device="cuda", generator=gen) - 3)
    A = -torch.rand(h, device="cuda", generator=gen) * 4 - 0.5
    B = torch.randn(b, s, g, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    C = torch.randn(b, s, g, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    D = torch.randn(h, device="cuda", generator=gen)
    out = [x, dt, A, B, C, D]
    return [t.requires_grad_() for t in out] if grad else out


def rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def kernel_traffic(b, s, h, p, g, n, chunk, e=2) -> dict:
    """HBM bytes per kernel of one forward and one backward, by the cost model's count
    (meshplan.costmodel.blocks.mamba2.ssd_kernel_bytes), under the profiler's kernel names."""
    nc = -(-s // chunk)
    traffic = ssd_kernel_bytes(b * nc * chunk, h, p, g, n, e, chunk)
    return {d: {"_" + k: v for k, v in ks.items()} for d, ks in traffic.items()}


def gradients(fn, ins, dy, seq_idx=None, chunk=64):
    leaves = [t.detach().clone().requires_grad_() for t in ins]
    y, _ = fn(*leaves, seq_idx=seq_idx, chunk=chunk)
    y.backward(dy.to(y.dtype))
    return [t.grad for t in leaves]


def accuracy(chunk: int) -> dict:
    """Gradients of the Triton scan (bf16 inputs) against autograd through the float64 reference,
    on a plain and a packed batch; a shape small enough for the float64 reference."""
    out = {}
    for name, sid in (("plain", None), ("packed_every_700", "packed")):
        b, s, h, p, g, n = 2, 2048, 16, 64, 1, 128
        ins = inputs(b, s, h, p, g, n, seed=3)
        seq_idx = (torch.arange(s, device="cuda") // 700).expand(b, s).contiguous() if sid else None
        dy = torch.randn(b, s, h, p, device="cuda", dtype=torch.bfloat16)
        want = gradients(ssd_chunked_ref, [t.double() for t in ins], dy.double(), seq_idx, chunk)
        got = gradients(ssd_chunked, ins, dy, seq_idx, chunk)
        out[name] = {k: rel(o, w) for k, o, w in zip(["x", "dt", "A", "B", "C", "D"], got, want)}
    return out


def profile(args) -> int:
    """CUDA time per kernel of one forward and one backward on the first shape (torch.profiler)."""
    b, s, h, p, g, n = SHAPES[0]
    x, dt, A, B, C, D = inputs(b, s, h, p, g, n)
    dy = torch.randn_like(x)

    def both():
        ssd_chunked(x, dt, A, B, C, D, chunk=args.chunk)
        ssd_bwd.ssd_backward(dy, None, x, dt, A, B, C, D, None, None, args.chunk)

    with torch.no_grad():
        for _ in range(2):
            both()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            both()
            torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    print(table)
    open(args.out, "w").write(table)
    return 0


def tune_forward(args) -> int:
    """The forward's headdim block and the warps of its output kernel, on the first shape."""
    import meshplan.kernels.ssd as ssd

    b, s, h, p, g, n = SHAPES[0]
    ins = inputs(b, s, h, p, g, n)
    rows = []
    for bp in (32, 64):
        for warps in (4, 8):
            ssd.FWD_WARPS = warps
            with torch.no_grad():
                t = median_time_s(lambda: ssd.ssd_forward(*ins, chunk=args.chunk, bp=bp), reps=10, warmup=2)
            rows.append({"bp": bp, "warps": warps, "forward_s": t})
            print(f"forward bp {bp} warps {warps}: {t * 1e3:.3f} ms", flush=True)
    json.dump(
        {
            "command": f"python benchmarks/bench_ssd.py --tune-forward --chunk {args.chunk} --out $OUT/tune-fwd.json",
            "gpu": torch.cuda.get_device_name(0),
            "shape": SHAPES[0],
            "runs": rows,
        },
        open(args.out, "w"),
        indent=1,
    )
    return 0


def tune_passing(args) -> int:
    """The state passings' tile (headdim × d_state), warps and pipeline stages, forward and backward
    direction, on the first two shapes: each kernel's profiled time."""
    import meshplan.kernels.ssd as ssd

    rows = []
    for b, s, h, p, g, n in SHAPES[:2]:
        x, dt, A, B, C, D = inputs(b, s, h, p, g, n)
        dy = torch.randn_like(x)
        pk = ssd.prepare(x, dt, A, B, C, None, args.chunk, 64)
        for bp, bn in ((16, 64), (32, 32), (32, 64), (32, 128), (64, 32), (64, 64)):
            for warps in (2, 4, 8):
                for stages in (2, 3, 4):
                    launch.PASS_HEADDIM_BLOCK, launch.PASS_STATE_BLOCK = bp, bn
                    ssd.PASS_WARPS, ssd.PASS_STAGES = warps, stages

                    def both():
                        ssd.pass_states(pk, pk.x, pk.B, None, x.dtype)
                        ssd.pass_states(pk, dy, pk.C, None, x.dtype, reverse=True, xt=h * p, bt=pk.ct)

                    with torch.no_grad():
                        k = kernel_times(both, ("_state_passing", "_state_passing_bwd"))
                    rows.append(
                        {
                            "shape": [b, s, h, p, g, n],
                            "bp": bp,
                            "bn": bn,
                            "warps": warps,
                            "stages": stages,
                            "forward_s": k["_state_passing"],
                            "backward_s": k["_state_passing_bwd"],
                        }
                    )
                    print(
                        f"{b}x{s} bp {bp} bn {bn} warps {warps} stages {stages}: "
                        f"{k['_state_passing'] * 1e3:.3f} / {k['_state_passing_bwd'] * 1e3:.3f} ms",
                        flush=True,
                    )
    json.dump(
        {
            "command": f"python benchmarks/bench_ssd.py --tune-passing --chunk {args.chunk} --out $OUT/tune-pass.json",
            "gpu": torch.cuda.get_device_name(0),
            "runs": rows,
        },
        open(args.out, "w"),
        indent=1,
    )
    return 0


# Shapes of the segmented-passing sweep: the main rows, and long rows of one sequence (a context shard).
# Session 23: mamba2-130m's 24 heads at 16K on one GPU, and its halves (tpssm=2's 12 heads, sp=2's 8K shard),
# where a whole row's passing runs 48 or 24 programs (the packed-documents row's profiles: 11.6-11.7 ms of
# its 80 ms step in the forward passings, benchmarks/results/s23-h200x2-graphs/profile/).
SEGMENT_SHAPES = SHAPES + (
    (2, 8192, 80, 64, 1, 128),
    (1, 131072, 80, 64, 1, 128),
    (1, 65536, 40, 64, 1, 128),
    (1, 16384, 24, 64, 1, 128),
    (1, 16384, 12, 64, 1, 128),
    (1, 8192, 24, 64, 1, 128),
)


def segments(args) -> int:
    """Segmented state passings (meshplan.kernels.launch.pass_segments) against whole rows: for each
    shape, unsegmented, then each program target with the forward's passing alone segmented and with
    the backward's too (launch's PASS_SEGMENT_BELOW thresholds lifted), in two interleaved rounds — the
    whole calls' median times, each kernel's profiled time, the kernel bandwidth fractions (as the main
    table counts them: the join's bytes are not counted), and the outputs and gradients against the
    unsegmented run's."""
    copy_bw = copy_roofline_bytes_per_s()
    variants = [("whole", 0, False)] + [
        (f"{w}-{t}", t, w == "both") for t in (256, 512, 1024, 2048) for w in ("forward", "both")
    ]
    rows = []
    for shape in SEGMENT_SHAPES:
        rows += _segment_rows(shape, variants, args.chunk, copy_bw)
        torch.cuda.empty_cache()
    json.dump(
        {
            "command": f"python benchmarks/bench_ssd.py --segments --chunk {args.chunk} --out $OUT/ssd-segments.json",
            "gpu": torch.cuda.get_device_name(0),
            "copy_bytes_per_s": copy_bw,
            "runs": rows,
        },
        open(args.out, "w"),
        indent=1,
    )
    return 0


def _segment_rows(shape, variants, chunk: int, copy_bw: float) -> list[dict]:
    import meshplan.kernels.ssd as ssd

    b, s, h, p, g, n = shape
    x, dt, A, B, C, D = ins = inputs(b, s, h, p, g, n)
    dy = torch.randn_like(x)
    traffic = kernel_traffic(b, s, h, p, g, n, chunk)

    def fwd():
        return ssd.ssd_forward(*ins, chunk=chunk)

    def bwd():
        return ssd_bwd.ssd_backward(dy, None, x, dt, A, B, C, D, None, None, chunk)

    base, rows = None, []
    for rnd in range(2):
        for name, target, backward_too in variants:
            launch.PASS_PROGRAM_TARGET = target  # cut whatever the programs where a target is set
            launch.PASS_SEGMENT_BELOW = 10**9 if target else 0
            launch.PASS_SEGMENT_BACKWARD_BELOW = 10**9 if target and backward_too else 0
            with torch.no_grad():
                y, final = fwd()
                grads = bwd()[:6]
                base = base or (y, final, grads)
                diff = {
                    "y": rel(y, base[0]),
                    "final": rel(final, base[1]),
                    **{k: rel(o, w) for k, o, w in zip(("x", "dt", "A", "B", "C", "D"), grads, base[2])},
                }
                del y, final, grads
                t_fwd, t_bwd = median_time_s(fwd, reps=10, warmup=2), median_time_s(bwd, reps=10, warmup=2)
                k_fwd, k_bwd = kernel_times(fwd, FWD_KERNELS), kernel_times(bwd, BWD_KERNELS)
            kf = sum(v for k, v in k_fwd.items() if k != "other")
            kb = sum(v for k, v in k_bwd.items() if k != "other")
            row = {
                "round": rnd,
                "shape": list(shape),
                "variant": name,
                "segments": launch.pass_segments(b, h, p, n, -(-s // chunk)),
                "forward_s": t_fwd,
                "backward_s": t_bwd,
                "kernels_forward_s": k_fwd,
                "kernels_backward_s": k_bwd,
                "forward_kernel_fraction": sum(traffic["forward"].values()) / kf / copy_bw,
                "backward_kernel_fraction": sum(traffic["backward"].values()) / kb / copy_bw,
                "rel_diff_vs_whole_rows": diff,
            }
            rows.append(row)
            print(
                f"r{rnd} {b}x{s}x{h} {name:13s} seg {row['segments'][0]:2d}: fwd {t_fwd * 1e3:.3f} ms "
                f"(kernels {kf * 1e3:.3f}, {row['forward_kernel_fraction']:.0%}), bwd {t_bwd * 1e3:.3f} ms "
                f"(kernels {kb * 1e3:.3f}, {row['backward_kernel_fraction']:.0%}); "
                + ", ".join(f"{k.strip('_')} {v * 1e3:.3f}" for k, v in k_bwd.items())
                + f"; max diff {max(diff.values()):.1e}",
                flush=True,
            )
    return rows


def tune(args) -> int:
    """The backward's settings — headdim block, the dx and the dB/dC kernels' warps, the d_state
    block — on the first shape: the whole call's time and each kernel's profiled time."""
    b, s, h, p, g, n = SHAPES[0]
    x, dt, A, B, C, D = inputs(b, s, h, p, g, n)
    dy = torch.randn_like(x)
    rows = []
    for bp in (16, 32, 64):
        for warps in (4, 8):
            for dbc_warps in (4, 8):
                for block in (64, 128):
                    launch.BWD_STATE_BLOCK = block

                    def call():
                        return ssd_bwd.ssd_backward(
                            dy, None, x, dt, A, B, C, D, None, None, args.chunk, bp, None, warps, dbc_warps
                        )

                    with torch.no_grad():
                        t = median_time_s(call, reps=5, warmup=1)
                        k = kernel_times(call, BWD_KERNELS)
                    rows.append(
                        {
                            "bp": bp,
                            "warps": warps,
                            "dbc_warps": dbc_warps,
                            "state_block": block,
                            "backward_s": t,
                            "kernels_s": k,
                        }
                    )
                    print(
                        f"bp {bp} warps {warps} dbc warps {dbc_warps} state block {block}: {t * 1e3:.2f} ms "
                        f"(dx {k['_chunk_bwd_dx'] * 1e3:.3f}, dbc {k['_chunk_bwd_dbc'] * 1e3:.3f} ms)",
                        flush=True,
                    )
    json.dump(
        {
            "command": f"python benchmarks/bench_ssd.py --tune --chunk {args.chunk} --out $OUT/tune.json",
            "gpu": torch.cuda.get_device_name(0),
            "shape": SHAPES[0],
            "runs": rows,
        },
        open(args.out, "w"),
        indent=1,
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--tune", action="store_true", help="time the backward's launch settings and stop")
    ap.add_argument("--profile", action="store_true", help="print the forward's and backward's kernels and stop")
    ap.add_argument("--tune-forward", action="store_true", help="time the forward's launch settings and stop")
    ap.add_argument("--tune-passing", action="store_true", help="time the state passings' launch settings and stop")
    ap.add_argument("--segments", action="store_true", help="time segmented state passings against whole rows and stop")
    args = ap.parse_args()
    chunk = args.chunk
    if args.tune:
        return tune(args)
    if args.profile:
        return profile(args)
    if args.tune_forward:
        return tune_forward(args)
    if args.tune_passing:
        return tune_passing(args)
    if args.segments:
        return segments(args)
    copy_bw = copy_roofline_bytes_per_s()
    rows = []
    for b, s, h, p, g, n in SHAPES:
        x, dt, A, B, C, D = ins = inputs(b, s, h, p, g, n)
        dy = torch.randn_like(x)
        with torch.no_grad():
            y, _ = ssd_chunked(*ins, chunk=chunk)
            ref, _ = ssd_chunked_ref(*(t.double() for t in ins), chunk=chunk)
            err = rel(y, ref)
            del ref
            t_fwd = median_time_s(lambda: ssd_chunked(*ins, chunk=chunk), reps=10, warmup=2)
            t_ref = median_time_s(lambda: ssd_chunked_ref(*ins, chunk=chunk), reps=3, warmup=2)
            t_bwd = median_time_s(
                lambda: ssd_bwd.ssd_backward(dy, None, x, dt, A, B, C, D, None, None, chunk), reps=10, warmup=2
            )
            k_fwd = kernel_times(lambda: ssd_chunked(*ins, chunk=chunk), FWD_KERNELS)
            k_bwd = kernel_times(
                lambda: ssd_bwd.ssd_backward(dy, None, x, dt, A, B, C, D, None, None, chunk), BWD_KERNELS
            )
        leaves = [t.detach().requires_grad_() for t in ins]

        def ref_train():
            yr, _ = ssd_chunked_ref(*leaves, chunk=chunk)
            yr.backward(dy)

        t_ref_train = median_time_s(ref_train, reps=3, warmup=1)
        traffic = kernel_traffic(b, s, h, p, g, n, chunk, x.element_size())
        kernels = {
            d: {
                k: {"s": t, "bytes": traffic[d].get(k), "bandwidth_fraction": traffic[d][k] / t / copy_bw}
                if k in traffic[d]
                else {"s": t}
                for k, t in times.items()
            }
            for d, times in (("forward", k_fwd), ("backward", k_bwd))
        }
        rows.append(
            {
                "b": b,
                "s": s,
                "heads": h,
                "headdim": p,
                "ngroups": g,
                "d_state": n,
                "chunk": chunk,
                "rel_err_vs_fp64": err,
                "forward_s": t_fwd,
                "backward_s": t_bwd,
                "torch_reference_forward_s": t_ref,
                "torch_reference_train_s": t_ref_train,
                "speedup_over_reference": t_ref / t_fwd,
                "train_speedup_over_reference": t_ref_train / (t_fwd + t_bwd),
                "bandwidth_fraction": sum(traffic["forward"].values()) / t_fwd / copy_bw,
                "backward_bandwidth_fraction": sum(traffic["backward"].values()) / t_bwd / copy_bw,
                "kernels": kernels,
            }
        )
        torch.cuda.empty_cache()
    # Packed rows: boundaries every 700 tokens, against the float64 reference with the same seq_idx.
    b, s, h, p, g, n = 2, 4096, 16, 64, 1, 128
    ins = inputs(b, s, h, p, g, n, seed=1)
    sid = (torch.arange(s, device="cuda") // 700).expand(b, s).contiguous()
    with torch.no_grad():
        y, _ = ssd_chunked(*ins, seq_idx=sid, chunk=chunk)
        ref, _ = ssd_chunked_ref(*(t.double() for t in ins), seq_idx=sid, chunk=chunk)
    packed_err = rel(y, ref)
    grads = accuracy(chunk)
    out = {
        "command": f"python benchmarks/bench_ssd.py --out $OUT/ssd.json --chunk {chunk}",
        "gpu": torch.cuda.get_device_name(0),
        "copy_bytes_per_s": copy_bw,
        "runs": rows,
        "packed_rel_err_vs_fp64": packed_err,
        "gradient_rel_err_vs_fp64": grads,
    }
    json.dump(out, open(args.out, "w"), indent=1)
    print(
        f"packed rows (seq_idx): rel err {packed_err:.1e}; gradient rel err vs fp64: "
        + "; ".join(f"{k}: " + ", ".join(f"{n} {v:.1e}" for n, v in d.items()) for k, d in grads.items())
    )
    for r in rows:
        per = {
            d: ", ".join(
                f"{k.strip('_')} {v['s'] * 1e3:.2f} ms" + (f" {v['bandwidth_fraction']:.0%}" if "bytes" in v else "")
                for k, v in ks.items()
            )
            for d, ks in r["kernels"].items()
        }
        print(
            f"b {r['b']} s {r['s']} h {r['heads']} chunk {chunk}: fwd {r['forward_s'] * 1e3:.2f} ms "
            f"({r['bandwidth_fraction']:.0%} roofline; {per['forward']}), bwd "
            f"{r['backward_s'] * 1e3:.2f} ms ({r['backward_bandwidth_fraction']:.0%}; {per['backward']}); "
            "torch reference fwd "
            f"{r['torch_reference_forward_s'] * 1e3:.1f} ms ({r['speedup_over_reference']:.1f}×), fwd+bwd "
            f"{r['torch_reference_train_s'] * 1e3:.1f} ms ({r['train_speedup_over_reference']:.1f}×); "
            f"rel err {r['rel_err_vs_fp64']:.1e}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Registers, spills and instruction counts of Triton kernels compiled offline for sm_90 (no GPU needed:
the ptxas and nvdisasm that ship with Triton). Counts per loop body (a backward branch) are what a
time-marching kernel issues per step. Prints a table and writes JSON.

    python benchmarks/sass_counts.py --out benchmarks/results/sass-counts.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from meshplan.kernels import conv1d, launch, ssd, ssd_bwd

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
INSTR = re.compile(r"\s+/\*[0-9a-f]{4}\*/")
OP = re.compile(r"\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)")


def compile_sm90(fn, signature: dict, constexprs: dict, num_warps: int, maxnreg: int = 0):
    """The kernel compiled for sm_90, every pointer and integer argument taken as 16-divisible (as the
    launches here pass them); `maxnreg` caps the registers a thread as the launch does."""
    attrs = {(i,): [["tt.divisibility", 16]] for i, v in enumerate(signature.values()) if v != "constexpr"}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": num_warps, "num_stages": 1} | ({"maxnreg": maxnreg} if maxnreg else {})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def _tool(name: str, cubin: bytes, *args: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([os.path.join(BIN, name), *args, f.name], capture_output=True, text=True).stdout


def _ops(lines: list[str]) -> dict:
    ops = collections.Counter()
    for line in lines:
        m = OP.search(line)
        if m:
            ops[m.group(2).split(".")[0]] += 1
    return dict(ops.most_common())


def counts(kernel) -> dict:
    """Registers, stack bytes (spills), instructions, and each loop body's instructions and op mix."""
    cubin = kernel.asm["cubin"]
    usage = re.search(r"REG:(\d+).*?STACK:(\d+)", _tool("cuobjdump", cubin, "--dump-resource-usage"))
    lines = [x for x in _tool("nvdisasm", cubin, "-c").splitlines() if INSTR.match(x) or x.startswith(".L")]
    label_at = {x.rstrip(":"): i for i, x in enumerate(lines) if x.startswith(".L")}
    loops = []
    for i, line in enumerate(lines):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if m and label_at.get(m.group(1), i + 1) < i:
            body = [x for x in lines[label_at[m.group(1)] : i + 1] if INSTR.match(x)]
            if len(body) > 1:
                loops.append({"instructions": len(body), "ops": _ops(body)})
    instrs = [x for x in lines if INSTR.match(x)]
    return {
        "registers": int(usage.group(1)),
        "stack_bytes": int(usage.group(2)),
        "instructions": len(instrs),
        "loops": loops,
    }


@triton.jit
def _silu_torch_style(x_ptr, o_ptr):
    i = tl.program_id(0) * 128 + tl.arange(0, 128)
    x = tl.load(x_ptr + i).to(tl.float32)
    tl.store(o_ptr + i, (x * tl.sigmoid(x)).to(tl.bfloat16))


@triton.jit
def _silu_ours(x_ptr, o_ptr):
    i = tl.program_id(0) * 128 + tl.arange(0, 128)
    x = tl.load(x_ptr + i).to(tl.float32)
    tl.store(o_ptr + i, (x * conv1d._sigmoid(x)).to(tl.bfloat16))


CONV_ARGS = {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "idx_ptr": "*i32"}


def _signature(names: str, types: str, constexprs: str) -> dict:
    """A kernel's runtime arguments' types by name, then its constexpr arguments."""
    return dict(zip(names.split(), types.split(), strict=True)) | dict.fromkeys(constexprs.split(), "constexpr")


def _whole_and_segmented(name: str, fn, signature: dict, constexprs: dict, warps: int, what: str) -> dict:
    """An SSD kernel compiled with its rows' state passings whole and in segments (SEGMENTED)."""
    return {
        name: (compile_sm90(fn, signature, constexprs | {"SEGMENTED": False}, warps), what),
        f"{name}_segmented": (
            compile_sm90(fn, signature, constexprs | {"SEGMENTED": True}, warps),
            "the same, the state passings in segments",
        ),
    }


def kernels() -> dict:
    """Name → (kernel, what it is). Shapes and settings are the committed launch settings at
    5376 channels and a 64-token chunk of 80 heads × 64, d_state 128."""
    c = conv1d
    fwd_sig = {**CONV_ARGS, "out_ptr": "*bf16", "T": "i32", "C": "i32", "L": "i32", "XT": "i32"} | dict.fromkeys(
        ("K", "HAS_IDX", "SILU", "BC", "STAGES", "EVEN_C", "SPAN"), "constexpr"
    )
    bwd_sig = {
        **CONV_ARGS,
        "dout_ptr": "*bf16",
        "dx_ptr": "*bf16",
        "dw_part_ptr": "*fp32",
        "db_part_ptr": "*fp32",
        "T": "i32",
        "C": "i32",
        "L": "i32",
        "XT": "i32",
    } | dict.fromkeys(("K", "HAS_IDX", "SILU", "BC", "STAGES", "EVEN_C", "PREFETCH", "SPAN"), "constexpr")
    fwd_k = dict(
        K=4,
        HAS_IDX=True,
        SILU=True,
        BC=c.MARCH_FWD_CHANNELS,
        STAGES=c.MARCH_FWD_STAGES,
        EVEN_C=True,
        SPAN=triton.next_power_of_2(c.MARCH_FWD_ROWS + 3),
    )
    bwd_k = dict(
        K=4,
        HAS_IDX=True,
        SILU=True,
        BC=c.MARCH_CHANNELS,
        STAGES=c.MARCH_STAGES,
        EVEN_C=True,
        PREFETCH=c.MARCH_PREFETCH,
        SPAN=triton.next_power_of_2(c.MARCH_ROWS + 9),
    )
    i32 = lambda n: " i32" * n  # noqa: E731
    passing = _signature(
        "x_ptr w_ptr decay_ptr b_ptr start_ptr out_ptr end_ptr delta_ptr span_ptr S H G P N XT BT K NSEG",
        "*bf16 *fp32 *fp32 *bf16 *fp32 *bf16 *fp32 *fp32 *fp32" + i32(9),
        "HAS_START SEGMENTED L BP BN STAGES",
    )
    scan = _signature(
        "x_ptr dt_ptr a_ptr b_ptr c_ptr d_ptr enter_ptr starts_ptr delta_ptr sid_ptr prev_ptr y_ptr "
        "S H G P N XT BT CT K NSEG",
        "*bf16 *fp32 *fp32 *bf16 *bf16 *fp32 *bf16 *bf16 *fp32 *i32 *i32 *bf16" + i32(10),
        "HPP HAS_D HAS_SID SEGMENTED L BP BN STAGES",
    )
    dx = _signature(
        "x_ptr dt_ptr a_ptr b_ptr c_ptr d_ptr enter_ptr e_starts_ptr e_delta_ptr ds_ptr ds_starts_ptr "
        "ds_delta_ptr dy_ptr sid_ptr prev_ptr keep_ptr dx_ptr ddt_ptr dcb_ptr da_ptr dd_ptr "
        "S H G P N XT BT CT K NSEG",
        "*bf16 *fp32 *fp32 *bf16 *bf16 *fp32 *bf16 *bf16 *fp32 *bf16 *bf16 *fp32 *bf16 *i32 *i32 "
        "*fp32 *bf16 *fp32 *bf16 *fp32 *fp32" + i32(10),
        "HAS_D HAS_SID SEGMENTED L BP BN",
    )
    dbc = _signature(
        "x_ptr dt_ptr a_ptr b_ptr c_ptr enter_ptr e_starts_ptr e_delta_ptr ds_ptr ds_starts_ptr "
        "ds_delta_ptr dy_ptr sid_ptr prev_ptr dcb_ptr db_ptr dc_ptr S H G P N XT BT CT K NSEG",
        "*bf16 *fp32 *fp32 *bf16 *bf16 *bf16 *bf16 *fp32 *bf16 *bf16 *fp32 *bf16 *i32 *i32 *bf16 *fp32 *fp32" + i32(10),
        "HPP HAS_SID SEGMENTED L BP BN",
    )
    bp, bn = launch.pass_tile(64, 128)
    ssd_kernels = {
        **_whole_and_segmented(
            "ssd_state_passing",
            ssd._state_passing,
            passing,
            dict(HAS_START=False, L=64, BP=bp, BN=bn, STAGES=ssd.PASS_STAGES),
            ssd.PASS_WARPS,
            f"forward, {bp} x {bn} state tile",
        ),
        **_whole_and_segmented(
            "ssd_chunk_scan",
            ssd._chunk_scan,
            scan,
            dict(HPP=10, HAS_D=True, HAS_SID=False, L=64, BP=ssd.FWD_HEADDIM_BLOCK, BN=128, STAGES=ssd.FWD_STAGES),
            ssd.FWD_WARPS,
            "forward output kernel, 10 heads a program, headdim block 64, d_state 128",
        ),
        **_whole_and_segmented(
            "ssd_chunk_bwd_dx",
            ssd_bwd._chunk_bwd_dx,
            dx,
            dict(HAS_D=True, HAS_SID=False, L=64, BP=ssd_bwd.BWD_HEADDIM_BLOCK, BN=128),
            ssd_bwd.BWD_WARPS,
            "chunk 64, headdim block 32, d_state 128",
        ),
        # mamba2-2.7b's 80 heads in one group: 10 a program (launch.bwd_splits at 16K tokens)
        **_whole_and_segmented(
            "ssd_chunk_bwd_dbc",
            ssd_bwd._chunk_bwd_dbc,
            dbc,
            dict(HPP=10, HAS_SID=False, L=64, BP=ssd_bwd.BWD_HEADDIM_BLOCK, BN=launch.BWD_STATE_BLOCK),
            ssd_bwd.BWD_DBC_WARPS,
            "chunk 64, 10 heads, headdim block 32, d_state 128",
        ),
    }
    silu_sig = {"x_ptr": "*bf16", "o_ptr": "*bf16"}
    return {
        "silu_tl_sigmoid": (compile_sm90(_silu_torch_style, silu_sig, {}, 1), "x · tl.sigmoid(x), 4 elements a thread"),
        "silu_ours": (compile_sm90(_silu_ours, silu_sig, {}, 1), "x · conv1d._sigmoid(x), 4 elements a thread"),
        "conv_fwd_march": (
            compile_sm90(c._conv_fwd_march, fwd_sig, fwd_k, c.MARCH_FWD_WARPS),
            f"{c.MARCH_FWD_CHANNELS} channels, {c.MARCH_FWD_WARPS} warp(s), seq_idx",
        ),
        "conv_bwd_march_uncapped": (
            compile_sm90(c._conv_bwd_march, bwd_sig, bwd_k, c.MARCH_WARPS),
            f"{c.MARCH_CHANNELS} channels, {c.MARCH_WARPS} warps, seq_idx, no register cap",
        ),
        "conv_bwd_march": (
            compile_sm90(c._conv_bwd_march, bwd_sig, bwd_k, c.MARCH_WARPS, c.MARCH_MAXNREG),
            f"{c.MARCH_CHANNELS} channels, {c.MARCH_WARPS} warps, seq_idx, maxnreg {c.MARCH_MAXNREG}",
        ),
        **ssd_kernels,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = {}
    for name, (kernel, what) in kernels().items():
        rows[name] = {"what": what, **counts(kernel)}
        r = rows[name]
        loops = "; ".join(str(x["instructions"]) for x in r["loops"]) or "-"
        print(
            f"{name:24s} regs {r['registers']:3d}  stack {r['stack_bytes']:4d} B  instructions {r['instructions']:5d}"
            f"  loop bodies {loops}"
        )
    json.dump(
        {
            "command": "python benchmarks/sass_counts.py --out benchmarks/results/sass-counts.json",
            "triton": triton.__version__,
            "target": "sm_90 (offline, ptxas from the Triton wheel)",
            "kernels": rows,
        },
        open(args.out, "w"),
        indent=1,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

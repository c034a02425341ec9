"""meshplan's executor against plain PyTorch and mamba_ssm on the same training work (issue #34).

Dense: the 7B-shaped dense model's 2-layer stack (PRESETS["dense-7b"]: hidden 4096, 32 heads, gated MLP
16384), bf16, one sequence, forward + backward + the optimizer step on random hidden states, as
meshplan.executor.run.measure times its own step (CUDA events, median of --steps after --warmup). The
peers are the same layers written as torchtitan writes a Llama block — separate W_Q, W_K, W_V, W_O,
W_1 (gate), W_3 (up), W_2 (down) nn.Linear weights, RMSNorm, rotate-half rotary, SDPA, SwiGLU — and step
through the same MixedAdam, so a difference is the layers'.
- case dense-2layer-train (rank 0's GPU): torch-eager, torch-eager-cudnn (eager, SDPA on its default
  backend / cuDNN first); torch-compile, torch-compile-cudnn (each layer torch.compile'd, torchtitan's
  apply_compile per TransformerBlock), likewise; torch-compile-graphs, each layer compiled with
  mode="reduce-overhead" (the mode that may replay CUDA graphs; on an H100 lease it timed as the default
  mode did, 29.25 against 29.28 ms at 4K: benchmarks/results/peers-h100-s25.json).
- case dense-2layer-train-tp2 (ranks 0 and 1): meshplan's tp=2 against the peer layers under DTensor TP
  as torchtitan's apply_tp places them (ColwiseParallel on W_Q, W_K, W_V, W_1, W_3; RowwiseParallel on
  W_O, W_2; no sequence parallelism, as meshplan's tp=2 has none): dtensor-tp, dtensor-tp-compile.

Mamba-2 (rank 0's GPU; PRESETS["mamba2-2.7b"]: d_model 2560, 80 heads of 64, d_state 128, one group),
against mamba_ssm's own Triton kernels (peer mamba_ssm; benchmarks/peers_mamba.py), at each
--mamba-chunks (mamba_ssm's Mamba2 default 256, and meshplan's SSD_CHUNK; meshplan runs its own):
- case ssd-scan-fwd-bwd: the SSD scan of one sequence, forward + backward, as each library's block calls
  it (meshplan: dt's bias and softplus in fp32 torch, then its Triton scan; mamba_ssm:
  mamba_chunk_scan_combined with dt_bias and dt_softplus=True), from the same bf16 x, B, C, raw dt;
  on the GPU both sides are timed as the replay of their forward + backward captured as a CUDA graph
  (meshplan_ms, peer_ms, "timing": "cuda-graph": the GPU's time) and call by call (meshplan_call_ms,
  peer_call_ms: the host issuing each call sets the pace at 4K and moves with the lease's CPU);
- case mamba2-block-train: the 2-layer Mamba-2 stack's training step, shaped as the dense case (forward,
  backward, MixedAdam on random hidden states; meshplan's through run.measure), the peer being
  meshplan's Mamba2Block composed from mamba_ssm's pieces as its Mamba2 module runs without
  causal_conv1d (peers_mamba.PeerMamba2Block), with meshplan's weights; peer mamba_ssm launches its step
  call by call, peer mamba_ssm-graph replays it as a CUDA graph, as meshplan's own step is replayed.
Before timing, each Mamba pair runs once on the same inputs: the record holds each compared tensor's
norm-relative error (output, gradients), the largest (max_rel_err) and `agrees` (all within
peers_mamba.AGREE_REL_ERR). Without benchmarks/third_party/mamba_ssm (python
benchmarks/vendor_mamba_ssm.py) the Mamba cases are skipped with one line saying so.

Issue #34's run, on one H100 (every case but the tp2 one, 4K and 16K tokens; records are written after each
sequence), after `python benchmarks/vendor_mamba_ssm.py` here and carrying what it wrote
(carry: ["benchmarks/third_party"]):

    PYTHONPATH=. torchrun --nproc-per-node 1 benchmarks/peers.py --out $OUT/peers-h100.json

On two H100s, --nproc-per-node 2 runs all four cases in one call. On the CPU (gloo, a tiny dense and
Mamba-2 model, one short sequence; the Mamba cases need Triton's interpreter, set before triton is
imported, and are skipped without it):

    TRITON_INTERPRET=1 PYTHONPATH=. torchrun --nproc-per-node 2 benchmarks/peers.py --smoke --out /tmp/peers.json

Rank 0 writes a list of records {case, gpus, seq, meshplan_ms, cuda_graph, peer, peer_ms, …} after each sequence and
prints a table at the end (meshplan's step replayed as a CUDA graph where the executor captures it, as
`meshplan execute` runs it, with "meshplan_eager_ms" beside it then). `python benchmarks/peers.py --table
FILE…` prints README's Markdown table of results files (session 19's older names read as today's: normalized).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from contextlib import nullcontext
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import sdpa_kernel

from meshplan.executor.attention import CUDNN_FIRST
from meshplan.executor.blocks import DenseLayer
from meshplan.executor.comm import build_mesh
from meshplan.executor.optim import MixedAdam
from meshplan.executor.rotary import inv_freq
from meshplan.executor.run import graph_replay_s, measure, timed
from meshplan.kernels.launch import SSD_CHUNK
from meshplan.layout import parse_layout
from meshplan.models import PRESETS, ModelSpec, dense, mamba2

sys.path.insert(0, str(Path(__file__).parent))
import peers_mamba  # noqa: E402 (the Mamba-2 peers beside this script)

SEQS = (4096, 16384)
SINGLE_PEERS = ("torch-eager", "torch-eager-cudnn", "torch-compile", "torch-compile-cudnn", "torch-compile-graphs")
TP_PEERS = ("dtensor-tp", "dtensor-tp-compile")
MAMBA_PEERS = (peers_mamba.PEER, peers_mamba.PEER + "-graph")
DENSE_CASE, TP_CASE = "dense-2layer-train", "dense-2layer-train-tp2"
SCAN_CASE, BLOCK_CASE = "ssd-scan-fwd-bwd", "mamba2-block-train"
MAMBA_CHUNKS = (256, SSD_CHUNK)  # mamba_ssm's Mamba2 default chunk_size, and meshplan's


class PeerLayer(nn.Module):
    """A pre-norm Llama decoder layer as torchtitan writes one: local head counts come from the weights'
    shapes (view(..., -1, head_dim)), so DTensor's column-parallel projections leave it a rank's heads."""

    def __init__(self, model: ModelSpec):
        super().__init__()
        attn, mlp = model.attention, model.mlp
        self.head_dim, self.eps = attn.head_dim, model.norm_eps
        self.attention_norm = nn.RMSNorm(attn.hidden, eps=model.norm_eps)
        self.wq = nn.Linear(attn.hidden, attn.q_width, bias=False)
        self.wk = nn.Linear(attn.hidden, attn.kv_width, bias=False)
        self.wv = nn.Linear(attn.hidden, attn.kv_width, bias=False)
        self.wo = nn.Linear(attn.q_width, attn.hidden, bias=False)
        self.ffn_norm = nn.RMSNorm(mlp.hidden, eps=model.norm_eps)
        self.w1 = nn.Linear(mlp.hidden, mlp.ffn_hidden, bias=False)
        self.w3 = nn.Linear(mlp.hidden, mlp.ffn_hidden, bias=False)
        self.w2 = nn.Linear(mlp.ffn_hidden, mlp.hidden, bias=False)
        # fp32 angular frequencies kept off the module's buffers, which .to(bf16) would round
        self.inv_freq = inv_freq(model.rope, attn.head_dim)

    def load_from(self, ref: DenseLayer) -> "PeerLayer":
        """meshplan's layer's weights: W_QKV's rows split into W_Q, W_K, W_V; [gate; up] into W_1, W_3."""
        q_w, kv_w = ref.heads * ref.head_dim, ref.kv_heads * ref.head_dim
        wq, wk, wv = ref.w_qkv.detach().split([q_w, kv_w, kv_w])
        gate, up = ref.w_in.detach().chunk(2)
        pairs = [(self.wq, wq), (self.wk, wk), (self.wv, wv), (self.wo, ref.w_o), (self.w1, gate), (self.w3, up)]
        pairs += [(self.w2, ref.w_down), (self.attention_norm, ref.attn_norm.weight)]
        pairs += [(self.ffn_norm, ref.mlp_norm.weight)]
        with torch.no_grad():
            for module, weight in pairs:
                module.weight.copy_(weight)
        return self

    def rotate(self, t: torch.Tensor) -> torch.Tensor:
        """t (b, s, n, d) turned by each position (rotate-half, as meshplan.executor.rotary)."""
        positions = torch.arange(t.shape[1], device=t.device, dtype=torch.float32)
        angles = positions[:, None] * self.inv_freq.to(t.device)[None, :]
        cos, sin = angles.cos().to(t.dtype)[:, None, :], angles.sin().to(t.dtype)[:, None, :]
        x1, x2 = t.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.attention_norm(x)
        q = self.rotate(self.wq(h).view(b, s, -1, self.head_dim)).transpose(1, 2)
        k = self.rotate(self.wk(h).view(b, s, -1, self.head_dim)).transpose(1, 2)
        v = self.wv(h).view(b, s, -1, self.head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def peer_layers(model: ModelSpec, device: str, dtype: torch.dtype) -> nn.ModuleList:
    """The peer stack with meshplan's seeded weights (run.measure builds its reference after seed 1234)."""
    torch.manual_seed(1234)
    refs = [DenseLayer(model) for _ in range(model.layers)]
    return nn.ModuleList(PeerLayer(model).load_from(ref) for ref in refs).to(device=device, dtype=dtype)


def apply_tp(layers: nn.ModuleList, tp_mesh) -> None:
    """torchtitan's apply_tp for the layers' linears, without sequence parallelism."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {name: ColwiseParallel() for name in ("wq", "wk", "wv", "w1", "w3")}
    plan.update({name: RowwiseParallel() for name in ("wo", "w2")})
    for layer in layers:
        parallelize_module(layer, tp_mesh, plan)


def peer_step(layers: nn.ModuleList, seq: int, hidden: int, *, compiled: bool | str, args):
    """The peers' training step: forward, backward from a fixed gradient, MixedAdam (`compiled`: each
    layer torch.compile'd, in that mode where it is a string)."""
    device, dtype = args.device, args.dtype
    if compiled:
        mode = compiled if isinstance(compiled, str) else None
        for i, layer in enumerate(layers):
            layers[i] = torch.compile(layer, mode=mode)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(1, seq, hidden, device=device, dtype=dtype, generator=gen, requires_grad=True)
    dy = torch.randn(x.shape, device=device, dtype=dtype, generator=gen)
    opt = MixedAdam(layers.parameters())

    def step():
        h = x
        for layer in layers:
            h = layer(h)
        h.backward(dy)
        opt.step()
        opt.zero_grad()
        x.grad = None

    return step


def peer_step_ms(
    layers: nn.ModuleList, seq: int, hidden: int, *, compiled: bool | str, cudnn: bool, args, graph: bool = False
) -> float:
    """Median ms of the peers' training step (peer_step); with `graph`, of its replay as a CUDA graph."""
    step = peer_step(layers, seq, hidden, compiled=compiled, args=args)
    prefer = sdpa_kernel(CUDNN_FIRST, set_priority=True) if cudnn else nullcontext()
    with prefer:
        return graph_replay_ms(step, args) if graph else median_ms(step, args)  # compilation in the warm-up


def graph_replay_ms(step, args) -> float:
    """Median ms of one replay of `step` captured as a CUDA graph (run.graph_replay_s: the GPU's time) after
    --warmup calls, over --steps replays."""
    return graph_replay_s(step, args.steps, args.warmup) * 1e3


def median_ms(step, args) -> float:
    """Median ms of `step` over --steps calls after --warmup (run.timed: CUDA events on the GPU)."""
    cuda = args.device == "cuda"
    timed(step, args.warmup, cuda)
    return statistics.median(timed(step, args.steps, cuda)) * 1e3


def meshplan_ms(model: ModelSpec, layout: str, members: list[int], seq: int, args) -> dict | None:
    """meshplan's own step on the ranks `members` (None on the others), as `meshplan execute` runs it:
    {"meshplan_ms", "cuda_graph"} — replayed as a CUDA graph where the executor captures the step
    (meshplan.executor.graphs), and then also "meshplan_eager_ms", the step launched kernel by kernel."""
    lay = parse_layout(layout)
    mesh = build_mesh(lay, members)
    if mesh is None:
        return None

    def once(cuda_graph):
        return measure(
            model, lay, mesh, seq, 1, "train", steps=args.steps, warmup=args.warmup, device=args.device,
            dtype="bf16" if args.device == "cuda" else "fp32", exposed=False, host_samples=1, cuda_graph=cuda_graph,
        )  # fmt: skip

    result = once(None)
    out = {"meshplan_ms": result["step_time_s"] * 1e3, "cuda_graph": result["cuda_graph"]}
    if result["cuda_graph"]:
        del result
        _empty(args.device)
        out["meshplan_eager_ms"] = once(False)["step_time_s"] * 1e3
    return out


def single_gpu_cases(model: ModelSpec, seq: int, args) -> list[dict]:
    """Rank 0 alone: meshplan's single layout, then each single-GPU peer."""
    rank = dist.get_rank()
    mine = meshplan_ms(model, "single", [0], seq, args)
    records = []
    if rank == 0:
        for peer in args.peers:
            if peer not in SINGLE_PEERS:
                continue
            layers = peer_layers(model, args.device, args.dtype)
            compiled = "reduce-overhead" if peer == "torch-compile-graphs" else "compile" in peer
            ms = peer_step_ms(layers, seq, model.d_model, compiled=compiled, cudnn=peer.endswith("cudnn"), args=args)
            records.append({"case": DENSE_CASE, "gpus": 1, "seq": seq, **mine, "peer": peer, "peer_ms": ms})
            del layers
            _empty(args.device)
    dist.barrier()
    return records


def tp_cases(model: ModelSpec, seq: int, args) -> list[dict]:
    """Ranks 0 and 1: meshplan's tp=2, then the DTensor TP peers."""
    from torch.distributed.device_mesh import init_device_mesh

    mine = meshplan_ms(model, "tp=2", [0, 1], seq, args)
    records = []
    tp_mesh = init_device_mesh(args.device, (2,), mesh_dim_names=("tp",)) if dist.get_world_size() == 2 else None
    for peer in args.peers:
        if peer not in TP_PEERS or tp_mesh is None:
            continue
        layers = peer_layers(model, args.device, args.dtype)
        apply_tp(layers, tp_mesh)
        ms = peer_step_ms(layers, seq, model.d_model, compiled=peer.endswith("compile"), cudnn=False, args=args)
        records.append({"case": TP_CASE, "gpus": 2, "seq": seq, **mine, "peer": peer, "peer_ms": ms})
        del layers
        _empty(args.device)
    dist.barrier()
    return records


def mamba_cases(model: ModelSpec, seq: int, args) -> list[dict]:
    """Rank 0 alone: the SSD scan, then the Mamba-2 stack's training step, each against mamba_ssm's
    kernels at each --mamba-chunks, each pair checked before it is timed (benchmarks/peers_mamba.py)."""
    mine = meshplan_ms(model, "single", [0], seq, args)
    records = []
    if dist.get_rank() == 0:
        records = scan_records(model.mamba2, seq, args)
        for chunk in args.mamba_chunks:
            check = peers_mamba.block_errors(model, seq, args.mamba, chunk, args.device, args.dtype)
            _empty(args.device)
            refs = peers_mamba.reference_blocks(model, args.device, args.dtype)
            layers = peers_mamba.peer_blocks(model, args.mamba, chunk, refs)
            del refs
            for peer in (p for p in MAMBA_PEERS if p in args.peers):
                graph = peer.endswith("-graph")
                if graph and args.device != "cuda":
                    continue
                ms = peer_step_ms(layers, seq, model.d_model, compiled=False, cudnn=False, args=args, graph=graph)
                record = _mamba_record(BLOCK_CASE, seq, mine["meshplan_ms"], ms, chunk, check, layers=model.layers)
                records.append({**record, **mine, "peer": peer})
            del layers
            _empty(args.device)
    dist.barrier()
    return records


def scan_records(m, seq: int, args) -> list[dict]:
    """meshplan's scan, forward + backward from a fixed gradient, then mamba_ssm's at each chunk size."""
    leaves = peers_mamba.scan_inputs(m, seq, args.device, args.dtype)
    gen = torch.Generator(device=args.device).manual_seed(1)
    dy = torch.randn(leaves[0].shape, device=args.device, generator=gen).to(args.dtype)

    def scan_ms(fn) -> tuple[float, float]:
        """(ms of one call, with the host issuing it; ms of its replay as a CUDA graph, the GPU's alone)."""
        call = lambda: peers_mamba.forward_backward(fn, leaves, dy)  # noqa: E731
        return median_ms(call, args), graph_replay_ms(call, args) if args.device == "cuda" else float("nan")

    mine_call, mine = scan_ms(peers_mamba.meshplan_scan)
    records = []
    for chunk in args.mamba_chunks:
        check = peers_mamba.scan_errors(m, seq, args.mamba, chunk, args.device, args.dtype)
        peer_call, peer = scan_ms(peers_mamba.peer_scan(args.mamba, chunk))
        # The kernels' comparison is the GPU's time: issued call by call, each side's host (Python, autograd,
        # Triton's launches: 1.6-2.3 ms for meshplan, 3.6-5.8 for mamba_ssm on an H100 lease,
        # benchmarks/results/s25-h100-scan/scan-gpu-time-h100.json) sets the pace at 4K and moves with the lease's CPU.
        if args.device == "cuda":
            times = {"meshplan_ms": mine, "peer_ms": peer, "timing": "cuda-graph"}
        else:
            times = {"meshplan_ms": mine_call, "peer_ms": peer_call, "timing": "call"}
        record = _mamba_record(SCAN_CASE, seq, mine, peer, chunk, check, heads=m.nheads)
        records.append({**record, **times, "meshplan_call_ms": mine_call, "peer_call_ms": peer_call})
    _empty(args.device)
    return records


def _mamba_record(case: str, seq: int, mine: float, peer_ms: float, chunk: int, check: dict, **shape) -> dict:
    if not check["agrees"]:
        print(f"{case} seq {seq}: mamba_ssm (chunk {chunk}) differs from meshplan: {check['rel_err']}", flush=True)
    return {
        "case": case,
        "gpus": 1,
        "seq": seq,
        "meshplan_ms": mine,
        "peer": peers_mamba.PEER,
        "peer_ms": peer_ms,
        **shape,
        "meshplan_chunk": SSD_CHUNK,
        "peer_chunk": chunk,
        **check,
    }


def _empty(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()


def table(records: list[dict]) -> str:
    """The run's records, one a line, for the console."""
    head = f"{'case':22} {'gpus':>4} {'seq':>6} {'peer':24} {'meshplan ms':>12} {'peer ms':>10} {'peer/meshplan':>14}"
    lines = [head + f" {'max rel err':>12}"]
    for r in records:
        ratio = r["peer_ms"] / r["meshplan_ms"] if r["meshplan_ms"] else float("nan")
        times = f"{r['meshplan_ms']:>12.2f} {r['peer_ms']:>10.2f} {ratio:>14.2f}"
        err = f" {r['max_rel_err']:>12.1e}" if "max_rel_err" in r else ""
        lines.append(f"{r['case']:22} {r['gpus']:>4} {r['seq']:>6} {_peer_label(r):24} {times}{err}")
    return "\n".join(lines)


# The names of session 19's files (benchmarks/results/peers-h100-1gpu.json, peers-h200x2.json) → today's.
OLD_CASE = "dense-7b 2 layers train"
OLD_PEERS = {"dtensor-tp-eager": "dtensor-tp"}
# README's columns, in order: each peer's heading.
COLUMNS = {
    "torch-eager": "torch eager",
    "torch-eager-cudnn": "eager, cuDNN attention",
    "torch-compile": "torch.compile",
    "torch-compile-cudnn": "compile, cuDNN attention",
    "torch-compile-graphs": "compile, reduce-overhead",
    "dtensor-tp": "DTensor TP",
    "dtensor-tp-compile": "DTensor TP compiled",
    peers_mamba.PEER: "mamba_ssm",
    peers_mamba.PEER + "-graph": "mamba_ssm graphed",
}


def normalized(record: dict) -> dict:
    """A record under today's names: session 19 called both dense cases "dense-7b 2 layers train" and
    DTensor TP's eager peer "dtensor-tp-eager"."""
    r = dict(record)
    if r["case"] == OLD_CASE:
        r["case"] = DENSE_CASE if r["gpus"] == 1 else TP_CASE
    r["peer"] = OLD_PEERS.get(r["peer"], r["peer"])
    return r


def _peer_label(r: dict) -> str:
    return f"{r['peer']}, chunk {r['peer_chunk']}" if "peer_chunk" in r else r["peer"]


def _ms(ms: float) -> str:
    return f"{ms:.{1 if ms >= 10 else 2}f} ms"


def markdown(paths: list[str]) -> str:
    """README's table of results files: a row per case, GPUs and sequence, meshplan's time (and, where its
    step was replayed as a CUDA graph, the same step launched eagerly) and each peer's time over it (×;
    "differs" where the pair's check failed), then the files it came from."""
    rows: dict[tuple, dict] = {}
    columns: dict[str, str] = {}
    for path in paths:
        run = json.loads(Path(path).read_text())
        gpu = re.search(r"\b([A-Z]\d{3})\b", run.get("gpu") or "")
        gpu = gpu.group(1) if gpu else run.get("gpu") or "CPU"
        for r in map(normalized, run["records"]):
            row = rows.setdefault((r["case"], f"{r['gpus']} × {gpu}", r["seq"]), {"meshplan": r["meshplan_ms"]})
            if r.get("meshplan_eager_ms"):
                row["eager"] = r["meshplan_eager_ms"]
            label = _peer_label(r)
            row[label] = f"{r['peer_ms'] / r['meshplan_ms']:.2f}×" + ("" if r.get("agrees", True) else " differs")
            columns[label] = COLUMNS.get(r["peer"], r["peer"]) + label[len(r["peer"]) :]
    order = [c for p in COLUMNS for c in columns if c == p or c.startswith(p + ", ")]
    order += [c for c in columns if c not in order]
    lines = ["| case | GPUs | seq | meshplan | meshplan eager | " + " | ".join(columns[c] for c in order) + " |"]
    lines.append("|---|---|---:|---:|---:|" + "---:|" * len(order))
    cases = (DENSE_CASE, TP_CASE, SCAN_CASE, BLOCK_CASE)
    ordered = sorted(rows.items(), key=lambda kv: (cases.index(kv[0][0]) if kv[0][0] in cases else 4, kv[0][1:]))
    for (case, gpus, seq), row in ordered:
        cells = [
            case,
            gpus,
            f"{seq // 1024}K" if seq % 1024 == 0 else str(seq),
            _ms(row["meshplan"]),
            _ms(row["eager"]) if "eager" in row else "",
        ]
        lines.append("| " + " | ".join(cells + [row.get(c, "") for c in order]) + " |")
    names = ", ".join(f"`{Path(p).name}`" for p in paths)
    return "\n".join(lines) + f"\n\n(`python benchmarks/peers.py --table` of {names} in `benchmarks/results/`.)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="the results file rank 0 writes")
    ap.add_argument("--table", nargs="+", metavar="FILE", help="print README's table of these results files")
    ap.add_argument("--smoke", action="store_true", help="CPU, gloo, tiny models, one short sequence")
    ap.add_argument("--seqs", type=int, nargs="*", default=None)
    ap.add_argument("--peers", nargs="*", default=list(SINGLE_PEERS + TP_PEERS + MAMBA_PEERS))
    ap.add_argument("--mamba-chunks", type=int, nargs="+", default=list(MAMBA_CHUNKS))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    if args.table:
        print(markdown(args.table))
        return 0
    if not args.out:
        ap.error("--out is required (or --table)")
    cuda = torch.cuda.is_available() and not args.smoke
    args.device, args.dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=30))
    if args.smoke:
        model, seqs = dense("smoke-dense", 64, 2, 8, 4, 128, 100), args.seqs or [64]
        mamba_model = mamba2("smoke-mamba2", 64, 2, 100, d_state=16, headdim=16)
    else:
        model, seqs = replace(PRESETS["dense-7b"], layers=2), args.seqs or list(SEQS)
        mamba_model = replace(PRESETS["mamba2-2.7b"], layers=2)
    wants_mamba = any(p.startswith(peers_mamba.PEER) for p in args.peers)
    args.mamba = peers_mamba.load(cpu=not cuda) if wants_mamba else "not among --peers"
    if isinstance(args.mamba, str) and dist.get_rank() == 0:
        print(f"Mamba-2 cases skipped: {args.mamba}", flush=True)
    records: list[dict] = []
    for seq in seqs:
        records += single_gpu_cases(model, seq, args)
        if dist.get_world_size() >= 2:
            records += tp_cases(model, seq, args)
        if not isinstance(args.mamba, str):
            records += mamba_cases(mamba_model, seq, args)
        if dist.get_rank() == 0:
            _write(args, records, cuda)
    if dist.get_rank() == 0:
        print(table(records), flush=True)
    dist.destroy_process_group()
    return 0


def _write(args, records: list[dict], cuda: bool) -> None:
    meta = {
        "command": f"torchrun --nproc-per-node {dist.get_world_size()} benchmarks/peers.py " + " ".join(sys.argv[1:]),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
    }
    if not isinstance(args.mamba, str):
        meta["mamba_ssm"] = {"version": args.mamba.version, "commit": args.mamba.commit}
    with open(args.out, "w") as f:
        json.dump({**meta, "records": records}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())

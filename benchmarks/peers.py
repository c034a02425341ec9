"""meshplan's executor against plain PyTorch on the same training step (issue #34): the 7B-shaped dense
model's 2-layer stack (PRESETS["dense-7b"]: hidden 4096, 32 heads, gated MLP 16384), bf16, one sequence,
forward + backward + the optimizer step on random hidden states, as meshplan.executor.run.measure times
its own step (CUDA events, median of --steps after --warmup).

The peers are the same layers written as torchtitan writes a Llama block — separate W_Q, W_K, W_V, W_O,
W_1 (gate), W_3 (up), W_2 (down) nn.Linear weights, RMSNorm, rotate-half rotary, SDPA, SwiGLU — and step
through the same MixedAdam, so a difference is the layers'. On one GPU, at 4K and 16K tokens:
- torch-eager, torch-eager-cudnn: eager, SDPA on its default backend / cuDNN first;
- torch-compile, torch-compile-cudnn: each layer torch.compile'd (torchtitan's apply_compile, per
  TransformerBlock), likewise.
On two GPUs (the second launch rank onward), meshplan's tp=2 against the peer layers under DTensor TP as
torchtitan's apply_tp places them (ColwiseParallel on W_Q, W_K, W_V, W_1, W_3; RowwiseParallel on W_O,
W_2; no sequence parallelism, as meshplan's tp=2 has none): dtensor-tp-eager, dtensor-tp-compile.

    torchrun --nproc-per-node 2 benchmarks/peers.py --out $OUT/peers.json
    torchrun --nproc-per-node 2 benchmarks/peers.py --smoke --out /tmp/peers.json   (CPU, gloo: the plumbing)

Rank 0 writes a list of records {case, gpus, seq, meshplan_ms, peer, peer_ms} after each case and
prints a table at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from contextlib import nullcontext
from dataclasses import replace
from datetime import timedelta

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
from meshplan.executor.run import measure, timed
from meshplan.layout import parse_layout
from meshplan.models import PRESETS, ModelSpec, dense

SEQS = (4096, 16384)
SINGLE_PEERS = ("torch-eager", "torch-eager-cudnn", "torch-compile", "torch-compile-cudnn")
TP_PEERS = ("dtensor-tp-eager", "dtensor-tp-compile")
CASE = "dense-7b 2 layers train"


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


def peer_step_ms(layers: nn.ModuleList, seq: int, hidden: int, *, compiled: bool, cudnn: bool, args) -> float:
    """Median ms of the peers' training step: forward, backward from a fixed gradient, MixedAdam."""
    device, dtype = args.device, args.dtype
    if compiled:
        for i, layer in enumerate(layers):
            layers[i] = torch.compile(layer)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(1, seq, hidden, device=device, dtype=dtype, generator=gen, requires_grad=True)
    dy = torch.randn(x.shape, device=device, dtype=dtype, generator=gen)
    opt = MixedAdam(layers.parameters())
    prefer = sdpa_kernel(CUDNN_FIRST, set_priority=True) if cudnn else nullcontext()

    def step():
        h = x
        for layer in layers:
            h = layer(h)
        h.backward(dy)
        opt.step()
        opt.zero_grad()
        x.grad = None

    cuda = device == "cuda"
    with prefer:
        timed(step, args.warmup, cuda)  # compilation happens here
        return statistics.median(timed(step, args.steps, cuda)) * 1e3


def meshplan_ms(model: ModelSpec, layout: str, members: list[int], seq: int, args) -> float | None:
    """meshplan's own step on the ranks `members` (None on the others)."""
    lay = parse_layout(layout)
    mesh = build_mesh(lay, members)
    if mesh is None:
        return None
    result = measure(
        model, lay, mesh, seq, 1, "train", steps=args.steps, warmup=args.warmup, device=args.device,
        dtype="bf16" if args.device == "cuda" else "fp32", exposed=False, host_samples=1,
    )  # fmt: skip
    return result["step_time_s"] * 1e3


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
            ms = peer_step_ms(
                layers, seq, model.d_model, compiled="compile" in peer, cudnn=peer.endswith("cudnn"), args=args
            )
            records.append({"case": CASE, "gpus": 1, "seq": seq, "meshplan_ms": mine, "peer": peer, "peer_ms": ms})
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
        records.append({"case": CASE, "gpus": 2, "seq": seq, "meshplan_ms": mine, "peer": peer, "peer_ms": ms})
        del layers
        _empty(args.device)
    dist.barrier()
    return records


def _empty(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()


def table(records: list[dict]) -> str:
    lines = [f"{'gpus':>4} {'seq':>6} {'peer':22} {'meshplan ms':>12} {'peer ms':>10} {'peer/meshplan':>14}"]
    for r in records:
        ratio = r["peer_ms"] / r["meshplan_ms"] if r["meshplan_ms"] else float("nan")
        times = f"{r['meshplan_ms']:>12.2f} {r['peer_ms']:>10.2f} {ratio:>14.2f}"
        lines.append(f"{r['gpus']:>4} {r['seq']:>6} {r['peer']:22} {times}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU, gloo, a tiny model, one short sequence")
    ap.add_argument("--seqs", type=int, nargs="*", default=None)
    ap.add_argument("--peers", nargs="*", default=list(SINGLE_PEERS + TP_PEERS))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.smoke
    args.device, args.dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=30))
    if args.smoke:
        model, seqs = dense("smoke-dense", 64, 2, 8, 4, 128, 100), args.seqs or [64]
    else:
        model, seqs = replace(PRESETS["dense-7b"], layers=2), args.seqs or list(SEQS)
    records: list[dict] = []
    for seq in seqs:
        records += single_gpu_cases(model, seq, args)
        if dist.get_world_size() >= 2:
            records += tp_cases(model, seq, args)
        if dist.get_rank() == 0:
            _write(args, records, cuda)
    if dist.get_rank() == 0:
        print(table(records), flush=True)
    dist.destroy_process_group()
    return 0


def _write(args, records: list[dict], cuda: bool) -> None:
    meta = {
        "command": "torchrun --nproc-per-node N benchmarks/peers.py " + " ".join(sys.argv[1:]),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
    }
    with open(args.out, "w") as f:
        json.dump({**meta, "records": records}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())

"""The embedding, the output head and the loss on a mesh. Twin of the embedding / logits terms of
meshplan/costmodel/schedule.py (_embedding_comms) and memory.py (the logits phase).

- A tensor axis (TP, TP-SSM; with or without SP): the vocabulary is split (Megatron's vocab-parallel
  embedding and cross-entropy). The embedding looks up the rows it holds, zeroes the others and
  all-reduces; the head's input is copied onto the axis (its gradient all-reduced), each rank computes
  the logits of its vocabulary slice, and the loss takes the row maxima (all-reduce max) and then the
  sums of exponentials and the target logits (one all-reduce of two fp32 values a token). No rank
  holds all of a token's logits.
- TSP: the embedding and the head are split by hidden columns, 1/D each. Every rank has every
  sequence's token ids (input data); it looks up its columns of every rank's tokens and an all-to-all
  hands each rank the columns of its own tokens. The head's column shards travel the ring (the next
  shard in flight while the one in hand is multiplied), each rank summing its tokens' logits over the
  shards; the backward rings the shards again and reduce-scatters the partial weight gradients every
  rank made of every shard.
- Otherwise (SP, DP, none): whole weights, each rank on its own tokens.

The loss is the sum of the rank's token losses times `scale` (1 / the step's tokens): summed over the
token shards and micro-batches it is the mean. Inference returns the next token's log-probabilities
(of the rank's vocabulary slice under a tensor axis; on the rank that holds the last position under a
token split, an empty tensor elsewhere).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from meshplan.executor.comm import (
    AllToAll,
    CopyToAxis,
    Mesh,
    ReduceFromAxis,
    all_reduce,
    ring_shards,
    ring_weight_grads,
)
from meshplan.executor.layouts.common import Sharded, token_sum
from meshplan.executor.layouts.splits import vocab_split
from meshplan.executor.model import OutputHead, TokenEmbedding
from meshplan.kernels import cross_entropy


def _accumulator(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` in its accumulation dtype (fp32; float64 stays)."""
    return t.to(torch.promote_types(t.dtype, torch.float32), copy=True)


class _VocabParallelCE(torch.autograd.Function):
    """Per-token cross-entropy of logits (n, V_local) whose columns are vocabulary ids start.. of a
    vocabulary split over `axis` (None: not split). Saves the fp32 exponentials and the sums."""

    @staticmethod
    def forward(ctx, logits, labels, start, mesh, axis):
        ctx.fused = _ce_kernels(logits)
        if ctx.fused:  # three Triton passes (meshplan.kernels.cross_entropy), the same saved tensors
            return _fused_forward(ctx, logits, labels, start, mesh, axis)
        z = _accumulator(logits)
        top = z.amax(-1)
        if axis:
            all_reduce(mesh, top, axis, "max")
        z.sub_(top.unsqueeze(-1))
        inside, idx = _label_columns(labels, start, z.shape[-1])
        target = torch.where(inside, z.gather(1, idx.unsqueeze(-1)).squeeze(-1), 0.0)
        z.exp_()
        return _losses(ctx, mesh, axis, z, z.sum(-1), target, idx, inside, logits.dtype)

    @staticmethod
    def backward(ctx, grad):
        z, sums, idx, inside = ctx.saved_tensors
        if ctx.fused:
            return cross_entropy.logits_grad(z, sums, idx, inside, grad, ctx.dtype), None, None, None, None
        z.div_(sums.unsqueeze(-1))  # softmax, in place of the saved exponentials (one backward)
        z.scatter_add_(1, idx.unsqueeze(-1), -inside.to(z.dtype).unsqueeze(-1))
        z.mul_(grad.unsqueeze(-1).to(z.dtype))
        return z.to(ctx.dtype), None, None, None, None


def _ce_kernels(logits: torch.Tensor) -> bool:
    """Whether the loss runs as meshplan.kernels.cross_entropy's passes: on the GPU (the CPU keeps the torch
    path; the tests dispatch the kernels under Triton's interpreter)."""
    return logits.is_cuda


def _fused_forward(ctx, logits, labels, start, mesh, axis):
    """_VocabParallelCE.forward through meshplan.kernels.cross_entropy: each row's max, sum of exponentials
    and label's logit in one pass; the maxima all-reduced and the sums rescaled to them; the fp32
    exponentials written in a second pass; the sums and the label's shifted logit all-reduced (the torch
    path's two all-reduces, of the same values)."""
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    m, s, t = cross_entropy.row_stats(logits, labels, start)
    top = m
    if axis:
        top = m.clone()
        all_reduce(mesh, top, axis, "max")
        s = s * torch.exp(m - top)
    inside, idx = _label_columns(labels, start, logits.shape[-1])
    z = cross_entropy.exponentials(logits, top)
    return _losses(ctx, mesh, axis, z, s, torch.where(inside, t - top, 0.0), idx, inside, logits.dtype)


def _label_columns(labels, start, width):
    """Whether each label lies in the slice of `width` vocabulary ids from `start`, and its column there (0 if not)."""
    inside = (labels >= start) & (labels < start + width)
    return inside, torch.where(inside, labels - start, 0)


def _losses(ctx, mesh, axis, z, sums, target, idx, inside, dtype):
    """The token losses log Σ exp − the label's shifted logit, the sums and targets summed over the vocabulary
    axis first; the exponentials z and what the backward needs saved."""
    stats = torch.stack([sums, target])
    if axis:
        all_reduce(mesh, stats, axis)
    sums, target = stats[0], stats[1]
    ctx.dtype = dtype
    ctx.save_for_backward(z, sums, idx, inside)
    return sums.log() - target


def log_softmax_over(logits: torch.Tensor, mesh: Mesh, axis: str | None) -> torch.Tensor:
    """log_softmax of logits (n, V_local) whose vocabulary is split over `axis`: one all-reduce of the
    row maxima, one of the sums of exponentials (fp32 each)."""
    z = _accumulator(logits)
    top = z.amax(-1, keepdim=True)
    if axis:
        all_reduce(mesh, top, axis, "max")
    z.sub_(top)
    sums = z.exp().sum(-1, keepdim=True)
    if axis:
        all_reduce(mesh, sums, axis)
    return z - sums.log()


class _TSPLogits(torch.autograd.Function):
    """x (n, h) → logits (n, V) in fp32, summed over the ring's column shards of the head."""

    @staticmethod
    def forward(ctx, x, w, mesh):
        c = w.shape[1]  # the column shards go round the tsp ring, each added in while the next travels
        summed = []  # the fp32 sum: the first shard's product converted, the others added in

        def add(j, shard):
            part = x[:, j * c : (j + 1) * c] @ shard.t()
            if summed:
                summed[0].add_(part)
            else:
                summed.append(part.to(torch.promote_types(x.dtype, torch.float32)))

        ring_shards(mesh, w, add)
        ctx.mesh = mesh
        ctx.save_for_backward(x, w)
        return summed[0]

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        g = grad.to(x.dtype)
        dx = torch.empty_like(x)
        c = w.shape[1]

        def grad_of(j, shard, out):  # shard j's gradient from this rank's tokens, into `out`
            cols = slice(j * c, (j + 1) * c)
            dx[:, cols] = g @ shard
            token_sum(g, x[:, cols], out)

        return dx, ring_weight_grads(ctx.mesh, w, grad_of), None


def take_vocab_matrix(module: Sharded, ref, mesh: Mesh, tensor_axis: str | None) -> int:
    """Give `module` its share of the reference's vocab × hidden `weight` — 1/D of the columns under TSP,
    1/T of the rows (vocabulary ids) on a tensor axis, all of it otherwise — and return the first
    vocabulary id it holds."""
    vocab, hidden = ref.weight.shape
    columns = mesh.layout.tsp > 1
    axis = "tsp" if columns else tensor_axis
    if axis is None:
        module.take("weight", ref, "weight")
        return 0
    ax = mesh.axis(axis)
    split = vocab_split(vocab, hidden, columns)
    module.take("weight", ref, "weight", split.dim, split.indices(ax.size, ax.rank))
    return 0 if columns else ax.rank * (vocab // ax.size)


class ParallelEmbedding(Sharded):
    """`positions[i]`: the positions rank i of the token axis holds (one entry without a token split);
    `index`: this rank's."""

    def __init__(
        self, ref: TokenEmbedding, mesh: Mesh, tensor_axis: str | None, positions: list[torch.Tensor], index: int
    ):
        super().__init__()
        self.mesh, self.tensor_axis = mesh, tensor_axis
        self.columns = mesh.layout.tsp > 1
        self.positions, self.all_positions = positions[index], positions
        self.start = take_vocab_matrix(self, ref, mesh, tensor_axis)

    def forward(self, tokens: torch.Tensor, decode: bool = False) -> torch.Tensor:
        """tokens (b, s): every position of the sequences (decode: the one new token, on every rank)."""
        if self.columns:
            b = tokens.shape[0]
            shards = [tokens if decode else tokens[:, p] for p in self.all_positions]
            parts = F.embedding(torch.stack(shards), self.weight)  # (D, b, t, h/D): one lookup, one gradient
            got = AllToAll.apply(parts, self.mesh, "tsp")  # row j: rank j's columns of this rank's tokens
            return got.permute(1, 2, 0, 3).reshape(b, got.shape[2], -1)
        mine = tokens if decode else tokens[:, self.positions]
        if not self.tensor_axis:
            return F.embedding(mine, self.weight)
        n = self.weight.shape[0]
        inside = (mine >= self.start) & (mine < self.start + n)
        rows_held = F.embedding(torch.where(inside, mine - self.start, 0), self.weight)
        return ReduceFromAxis.apply(rows_held.masked_fill(~inside.unsqueeze(-1), 0.0), self.mesh, self.tensor_axis)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.forward(tokens, decode=True)


class ParallelHead(Sharded):
    """Final norm, output matrix and loss. `positions`: this rank's token positions; `seq`: the
    sequence length (whose last position the prefill's prediction is made from)."""

    def __init__(self, ref: OutputHead, mesh: Mesh, tensor_axis: str | None, positions: torch.Tensor, seq: int):
        super().__init__()
        self.mesh, self.tensor_axis = mesh, tensor_axis
        self.columns = mesh.layout.tsp > 1
        self.positions = positions
        last = (positions == seq - 1).nonzero()
        self.last_index = int(last[0, 0]) if len(last) else None  # where this rank holds the last position
        self.take_norm("final_norm", ref)
        self.start = take_vocab_matrix(self, ref, mesh, tensor_axis)
        self.labels: list[torch.Tensor] = []  # (b, s) labels of the next training forwards, in order
        self.scale = 1.0

    def partial_grads(self) -> dict:
        """Under TSP every rank keeps the final norm's scale whole; its gradient, from the rank's own
        tokens, is summed over tsp after the backward."""
        return {"tsp": [self.final_norm.weight]} if self.columns else {}

    def tie(self, embedding: ParallelEmbedding) -> None:
        """Use the embedding's (identically split) matrix as this head's."""
        del self.weight
        self.weight = embedding.weight

    def _logits(self, xn: torch.Tensor) -> torch.Tensor:
        """xn (n, h) → this rank's logits (n, V_local)."""
        if self.columns:
            return _TSPLogits.apply(xn, self.weight, self.mesh)
        if self.tensor_axis and torch.is_grad_enabled():
            xn = CopyToAxis.apply(xn, self.mesh, self.tensor_axis)
        return F.linear(xn, self.weight)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Training (labels fed): the scaled sum of this rank's token losses. Inference: log-probs of the
        token after the last position."""
        if not self.labels:
            return self._next_token(h[:, self.last_index] if self.last_index is not None else h[:, :0].flatten(0, 1))
        labels = self.labels.pop(0)[:, self.positions].flatten()
        logits = self._logits(self.final_norm(h).flatten(0, 1))
        losses = _VocabParallelCE.apply(logits, labels, self.start, self.mesh, self.tensor_axis)
        return losses.sum() * self.scale

    def _next_token(self, h: torch.Tensor) -> torch.Tensor:
        return log_softmax_over(self._logits(self.final_norm(h)), self.mesh, self.tensor_axis)

    def decode(self, h: torch.Tensor) -> torch.Tensor:
        """h (b, 1, hidden), the same on every rank."""
        return self._next_token(h[:, -1])

"""Pipeline stages: each rank of the pp axis runs a contiguous 1/pp of the layers. Training runs the
one-forward-one-backward schedule of PipeDream-flush (Narayanan et al. 2021, §2.2, as Megatron-LM's
non-interleaved schedule does): stage s first runs pp − s − 1 forwards, then alternates one forward
and one backward, then finishes the backwards it owes, so that it holds at most pp − s micro-batches'
activations. A send and the receive that follows it go to the neighbours in one batch
(comm.exchange), so that adjacent stages, each doing the other's mirror image, never deadlock.
Gradients accumulate over the micro-batches; the gradient group's reductions run in the last one's
backward (parallelize.GradientSync.armed) — under ZeRO 2 and 3, whose gradients stay sharded, in each
micro-batch's, their shards summed (GradientSync.fold). Inference passes one request through the stages in turn.
"""

from __future__ import annotations

import torch
from torch import nn

from meshplan.executor.comm import Mesh, exchange

TAG_PIPELINE = 3


def stage_slice(n_layers: int, pp: int, stage: int) -> slice:
    """The layers stage `stage` of `pp` runs (pp divides the layers: executor.support checks)."""
    per = n_layers // pp
    return slice(stage * per, (stage + 1) * per)


def through(layers: nn.ModuleList, pipe: Pipeline | None, h: torch.Tensor, call=None) -> torch.Tensor | None:
    """h through this rank's layers (`call(layer, h)` for each, or its forward) and, under pipeline
    stages, the other stages': the output, None on all but the last stage."""
    if pipe is not None:
        return pipe.forward(h, call)
    for layer in layers:
        h = call(layer, h) if call is not None else layer(h)
    return h


class Pipeline:
    def __init__(self, layers: nn.ModuleList, mesh: Mesh, run, like: torch.Tensor | None = None):
        ax = mesh.axis("pp")
        self.layers, self.mesh, self.run = layers, mesh, run  # run(layers, x) -> y: the stage's forward
        # What a stage receives from the one before (shape, dtype, device), where that is not what the
        # first stage takes in (the whole model: token ids in, hidden states between the stages).
        self.like = like
        self.stage, self.stages = ax.rank, ax.size
        self.first, self.last = self.stage == 0, self.stage == self.stages - 1
        self.prev = None if self.first else self.stage - 1
        self.next = None if self.last else self.stage + 1

    def _swap(self, send: torch.Tensor | None, to: int | None, like: torch.Tensor | None, frm: int | None):
        if send is None and like is None:
            return None
        return exchange(self.mesh, "pp", send, to, like, frm, TAG_PIPELINE)

    def forward(self, x: torch.Tensor, step=None) -> torch.Tensor | None:
        """One request through every stage (prefill, or with `step` a decode step's per-layer call):
        the last stage's output there, None elsewhere. `x` is the first stage's input and every
        stage's input shape."""
        h = x if self.first else self._swap(None, None, self._like(x), self.prev)
        for layer in self.layers:
            h = step(layer, h) if step is not None else layer(h)
        if not self.last:
            self._swap(h, self.next, None, None)
            return None
        return h

    def _like(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.like is None else self.like

    def train(self, xs: list[torch.Tensor], dys: list[torch.Tensor], sync):
        """One training step over the micro-batches: `xs` the first stage's inputs (and every stage's
        shapes), `dys` the last stage's output gradients. Returns the first stage's input gradients
        and the last stage's outputs (each empty on the other stages)."""
        m = len(xs)
        warmup = min(self.stages - self.stage - 1, m)
        held: list[tuple[torch.Tensor, torch.Tensor]] = []
        grads: list[torch.Tensor] = []
        outs: list[torch.Tensor] = []
        done = 0  # backwards run

        def forward(inp: torch.Tensor) -> torch.Tensor:
            out = self.run(self.layers, inp)
            held.append((inp, out))
            if self.last:
                outs.append(out.detach())
            return out

        every = sync.zero >= 2  # sharded gradients: each micro-batch reduce-scatters its own

        def backward(grad_out: torch.Tensor) -> torch.Tensor | None:
            nonlocal done
            inp, out = held.pop(0)
            sync.armed = every or done == m - 1  # else the group's reductions wait for the last one
            out.backward(grad_out)
            done += 1
            if every and done < m:
                sync.fold()
            if self.first:
                grads.append(inp.grad)
            return None if self.first else inp.grad

        def take(i: int, received: torch.Tensor | None) -> torch.Tensor:
            """Micro-batch i's input: the first stage's own, or what the previous stage sent."""
            return xs[i] if self.first else received.requires_grad_(True)

        for i in range(warmup):
            out = forward(take(i, self._swap(None, None, self._like(xs[i]), self.prev)))
            self._swap(out.detach(), self.next, None, None)
        inp = take(warmup, self._swap(None, None, self._like(xs[warmup]), self.prev)) if warmup < m else None
        for k in range(m - warmup):
            i = warmup + k
            out = forward(inp)
            got = self._swap(out.detach(), self.next, out, self.next)
            grad_in = backward(dys[done] if self.last else got)
            if k == m - warmup - 1:
                self._swap(grad_in, self.prev, None, None)
            else:
                inp = take(i + 1, self._swap(grad_in, self.prev, self._like(xs[i + 1]), self.prev))
        for _ in range(warmup):
            like = held[0][1]
            grad_in = backward(dys[done] if self.last else self._swap(None, None, like, self.next))
            self._swap(grad_in, self.prev, None, None)
        return grads, outs

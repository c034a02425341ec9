"""Mixed-precision Adam as the memory model counts it (ZeRO paper §3): bf16 parameters and
gradients on the model, fp32 master weights, m and v in the optimizer (12 B/param)."""

from __future__ import annotations

import torch

from meshplan.executor.comm import all_gather_into_start, shard_len, shard_of


class MixedAdam:
    def __init__(self, params, lr: float = 1e-5, betas=(0.9, 0.95), eps: float = 1e-8):
        self.params = [p for p in params if p.requires_grad]
        self.master = [self._master(p) for p in self.params]
        self.m = [torch.zeros_like(w) for w in self.master]
        self.v = [torch.zeros_like(w) for w in self.master]
        self.lr, self.betas, self.eps, self.t = lr, betas, eps, 0

    def _master(self, p: torch.Tensor) -> torch.Tensor:
        return p.detach().float().clone()

    def _grad(self, p: torch.Tensor) -> torch.Tensor | None:
        return p.grad

    def _write(self, p: torch.Tensor, w: torch.Tensor) -> None:
        p.copy_(w)

    @torch.no_grad()
    def step(self) -> None:
        """One parameter at a time: cast its bf16 gradient to fp32 (the only transient), one fused
        AdamW kernel over master weight, m and v where torch has one, then the bf16 copy-back."""
        self.t += 1
        b1, b2 = self.betas
        fused = getattr(torch, "_fused_adamw_", None)
        # The step count as a device tensor, filled on the device once a step: torch.tensor(t, device=...)
        # copies from pageable host memory, which waits for the GPU to drain, once per parameter.
        steps: dict = {}
        for p, w, m, v in zip(self.params, self.master, self.m, self.v):
            grad = self._grad(p)
            if grad is None:
                continue
            g = grad.float()
            if fused is not None and w.is_cuda:
                if w.device not in steps:
                    steps[w.device] = torch.full((), float(self.t), device=w.device)
                fused(
                    [w],
                    [g],
                    [m],
                    [v],
                    [],
                    [steps[w.device]],
                    lr=self.lr,
                    beta1=b1,
                    beta2=b2,
                    weight_decay=0.0,
                    eps=self.eps,
                    amsgrad=False,
                    maximize=False,
                )
            else:
                c1, c2 = 1 - b1**self.t, 1 - b2**self.t
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                w.addcdiv_(m, v.sqrt().div_(c2**0.5).add_(self.eps), value=-self.lr / c1)
            self._write(p, w)
        self._written()

    def _written(self) -> None:
        pass

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


class ZeroAdam(MixedAdam):
    """ZeRO stages 1-3 (Rajbhandari et al. 2020, §5): each rank of the gradient group keeps the fp32
    master, m and v of its 1/n of every weight (the weight flattened, zero-padded to a multiple of n),
    updates them from its shard of the summed gradient (parallelize.GradientSync, which
    reduce-scattered it), and all-gathers the updated bf16 slices into every rank's whole weight —
    or, under ZeRO 3, writes them into the weight's shard, which the next forward gathers. The experts
    an ep axis splits keep 1/edp of their states and gather over edp (GradientSync.group_of)."""

    def __init__(self, params, sync, **kw):
        self.sync, self.weights = sync, sync.weights  # weights: ZeRO 3's shards, updated in place
        self.waits: list = []
        super().__init__(params, **kw)

    def _master(self, p: torch.Tensor) -> torch.Tensor:
        if self.weights is not None:
            return self.weights.shard(p).float().clone()
        _, n, rank = self.sync.group_of(p)  # the experts an ep axis splits: over edp
        return shard_of(p.detach(), n, rank).float().clone()

    def _grad(self, p: torch.Tensor) -> torch.Tensor | None:
        return self.sync.shard(p)

    def _write(self, p: torch.Tensor, w: torch.Tensor) -> None:
        if self.weights is not None:
            self.weights.shard(p).copy_(w)
            return
        axis, n, _ = self.sync.group_of(p)
        if n == 1:  # an expert on one edp rank: its states are whole here, nothing to gather
            p.data.view(-1).copy_(w)
            return
        s = shard_len(p.numel(), n)
        whole = p.data.view(-1) if s * n == p.numel() else torch.empty(s * n, dtype=p.dtype, device=p.device)
        self.waits.append((all_gather_into_start(self.sync.mesh, whole, w.to(p.dtype), axis), p, whole))
        if len(self.waits) > 2:  # two gathers in flight: their bf16 slices are the step's only transients
            self._land(*self.waits.pop(0))

    @staticmethod
    def _land(wait, p: torch.Tensor, whole: torch.Tensor) -> None:
        wait()
        if whole.data_ptr() != p.data_ptr():
            p.data.view(-1).copy_(whole[: p.numel()])

    def _written(self) -> None:
        for item in self.waits:
            self._land(*item)
        self.waits = []
        self.sync.clear()


def make_optimizer(params, sync):
    """The optimizer the layout's ZeRO stage calls for: ZeroAdam for stages 1-3, else MixedAdam."""
    return ZeroAdam(params, sync) if sync.zero else MixedAdam(params)

"""Mixed-precision Adam as the memory model counts it (ZeRO paper §3): bf16 parameters and
gradients on the model, fp32 master weights, m and v in the optimizer (12 B/param)."""

from __future__ import annotations

import torch


class MixedAdam:
    def __init__(self, params, lr: float = 1e-5, betas=(0.9, 0.95), eps: float = 1e-8):
        self.params = [p for p in params if p.requires_grad]
        self.master = [p.detach().float().clone() for p in self.params]
        self.m = [torch.zeros_like(w) for w in self.master]
        self.v = [torch.zeros_like(w) for w in self.master]
        self.lr, self.betas, self.eps, self.t = lr, betas, eps, 0

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for p, w, m, v in zip(self.params, self.master, self.m, self.v):
            if p.grad is None:
                continue
            g = p.grad.float()  # one parameter's fp32 gradient at a time: a small transient
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            w.addcdiv_(m, v.sqrt().div_(c2 ** 0.5).add_(self.eps), value=-self.lr / c1)
            p.copy_(w)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

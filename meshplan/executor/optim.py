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
        """One parameter at a time: cast its bf16 gradient to fp32 (the only transient), one fused
        AdamW kernel over master weight, m and v where torch has one, then the bf16 copy-back."""
        self.t += 1
        b1, b2 = self.betas
        fused = getattr(torch, "_fused_adamw_", None)
        # The step count as a device tensor, filled on the device once a step: torch.tensor(t, device=...)
        # copies from pageable host memory, which waits for the GPU to drain, once per parameter.
        steps: dict = {}
        for p, w, m, v in zip(self.params, self.master, self.m, self.v):
            if p.grad is None:
                continue
            g = p.grad.float()
            if fused is not None and w.is_cuda:
                if w.device not in steps:
                    steps[w.device] = torch.full((), float(self.t), device=w.device)
                fused([w], [g], [m], [v], [], [steps[w.device]], lr=self.lr, beta1=b1, beta2=b2, weight_decay=0.0,
                      eps=self.eps, amsgrad=False, maximize=False)
            else:
                c1, c2 = 1 - b1 ** self.t, 1 - b2 ** self.t
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                w.addcdiv_(m, v.sqrt().div_(c2 ** 0.5).add_(self.eps), value=-self.lr / c1)
            p.copy_(w)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

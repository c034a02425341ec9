"""Mixed-precision Adam as the memory model counts it (ZeRO paper §3): bf16 parameters and
gradients on the model, fp32 master weights, m and v in the optimizer (12 B/param). The step on a GPU
is meshplan.kernels.adam's one kernel a parameter, which allocates nothing (the cost model's meshplan
stack: Stack.optimizer_step_bytes_per_param, Stack.optimizer_fp32_temporaries)."""

from __future__ import annotations

import torch

from meshplan.executor.comm import all_gather_into_start, shard_len, shard_of
from meshplan.kernels.reference import adam_step_ref


class MixedAdam:
    """Adam over fp32 master weights, m and v, one parameter at a time. On a GPU each parameter's step
    is one Triton kernel (meshplan.kernels.adam): it reads the gradient in its own dtype, updates the
    master weight, m and v in place and writes the weight in the parameter's dtype straight into the
    parameter (`_dest`) — 28 B a parameter with bf16 gradients, and nothing allocated. Elsewhere (the
    CPU, or tensors the kernel does not take) torch's ops: the gradient cast to fp32 (the one fp32
    temporary, the parameter's size), torch's fused AdamW kernel where it has one, then the copy into
    `_dest`."""

    def __init__(self, params, lr: float = 1e-5, betas=(0.9, 0.95), eps: float = 1e-8):
        self.params = [p for p in params if p.requires_grad]
        self.master = [self._master(p) for p in self.params]
        self.m = [torch.zeros_like(w) for w in self.master]
        self.v = [torch.zeros_like(w) for w in self.master]
        self.lr, self.betas, self.eps, self.t = lr, betas, eps, 0
        self.scalars: torch.Tensor | None = None  # the bias corrections on the device (on_device_scalars)

    def _master(self, p: torch.Tensor) -> torch.Tensor:
        return _local(p.detach()).float().clone()

    def _grad(self, p: torch.Tensor) -> torch.Tensor | None:
        return None if p.grad is None else _local(p.grad, p)

    def _dest(self, p: torch.Tensor) -> torch.Tensor:
        """The flat tensor in p's dtype, of the master's length, that takes p's updated weight: p's own
        memory (a buffer copied back in `_wrote` for a parameter that is not contiguous)."""
        q = _local(p.data)
        return q.view(-1) if q.is_contiguous() else torch.empty(q.numel(), dtype=q.dtype, device=q.device)

    def _wrote(self, p: torch.Tensor, dest: torch.Tensor) -> None:
        """`dest` holds p's updated weight."""
        q = _local(p.data)
        if dest.data_ptr() != q.data_ptr():
            q.copy_(dest.view(q.shape))

    @torch.no_grad()
    def step(self) -> None:
        self.advance()
        self.apply()

    def advance(self) -> None:
        """Count the next step; for a captured step (`on_device_scalars`), write its bias corrections
        where the captured kernels read them (two fills, no host-device wait)."""
        self.t += 1
        if self.scalars is not None:
            from meshplan.kernels.adam import step_scalars

            for i, value in enumerate(step_scalars(self.lr, self.betas, self.t)):
                self.scalars[i].fill_(value)

    def on_device_scalars(self) -> str | None:
        """Make every step read its bias corrections from device memory, so that a CUDA graph of
        `apply` steps on as it replays (executor.graphs); None, or why it cannot (a parameter off the
        kernel's path takes torch's AdamW, which is handed the step count on the host)."""
        for p, w, m, v in zip(self.params, self.master, self.m, self.v):
            q = _local(p.data)  # the gradient and the written weight have the parameter's dtype and length
            if not q.is_contiguous() or not _use_kernel(w, m, v, q.view(-1), q.view(-1)):
                return f"optimizer: parameter of shape {tuple(p.shape)} is stepped by torch's AdamW, not the kernel"
        self.scalars = torch.zeros(2, dtype=torch.float32, device=self.master[0].device) if self.master else None
        return None

    @torch.no_grad()
    def apply(self) -> None:
        """Step self.t on every parameter that has a gradient (advance counted it)."""
        # The step count as a device tensor for torch's fused AdamW, filled on the device once a step:
        # torch.tensor(t, device=...) copies from pageable host memory, which waits for the GPU to
        # drain, once per parameter.
        steps: dict = {}
        for p, w, m, v in zip(self.params, self.master, self.m, self.v):
            grad = self._grad(p)
            if grad is None:
                continue
            dest = self._dest(p)
            if _use_kernel(w, m, v, grad, dest):
                from meshplan.kernels.adam import adam_step

                adam_step(
                    w, m, v, grad, dest, lr=self.lr, betas=self.betas, eps=self.eps, step=self.t, scalars=self.scalars
                )
            else:
                torch_adam_step(w, m, v, grad, dest, self.lr, self.betas, self.eps, self.t, steps)
            self._wrote(p, dest)
        self._written()

    def _written(self) -> None:
        pass

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


def _local(t: torch.Tensor, like: torch.Tensor | None = None) -> torch.Tensor:
    """A DTensor's shard on this rank (benchmarks/peers.py steps DTensor tensor-parallel layers with this
    optimizer: each rank updates the shard it holds), any other tensor itself. `like`: the parameter a
    gradient belongs to, whose placements the gradient must have (a partial sum would be stepped unreduced)."""
    if not hasattr(t, "to_local"):
        return t
    if like is not None and tuple(t.placements) != tuple(like.placements):
        raise ValueError(f"MixedAdam: a DTensor gradient placed {t.placements}, its parameter {like.placements}")
    return t.to_local()


def _use_kernel(w, m, v, grad, dest) -> bool:
    """Whether this parameter's step runs as meshplan.kernels.adam's kernel: on a GPU, for the tensors
    it takes (imported only there: Triton is a GPU machine's dependency)."""
    if not w.is_cuda:
        return False
    from meshplan.kernels.adam import fits

    return fits(w, m, v, grad, dest)


def torch_adam_step(w, m, v, grad, dest, lr: float, betas, eps: float, t: int, steps: dict | None = None) -> None:
    """Step t of Adam on one parameter through torch's ops (MixedAdam off the GPU kernel's path): the
    gradient cast to fp32, torch's fused AdamW kernel over master weight, m and v on a GPU (the reference's
    arithmetic elsewhere), then `dest` ← the weight. 40 B a parameter with bf16 gradients on a GPU: the
    cast reads 2 and writes 4, the fused kernel reads 16 and writes 12, the copy reads 4 and writes 2.
    `steps`: the step count's device tensor by device, made once a step."""
    fused = getattr(torch, "_fused_adamw_", None)
    if fused is None or not w.is_cuda:
        adam_step_ref(w, m, v, grad, dest, lr=lr, betas=betas, eps=eps, step=t)
        return
    steps = {} if steps is None else steps
    if w.device not in steps:
        steps[w.device] = torch.full((), float(t), device=w.device)
    b1, b2 = betas
    fused(
        [w],
        [grad.float()],
        [m],
        [v],
        [],
        [steps[w.device]],
        lr=lr,
        beta1=b1,
        beta2=b2,
        weight_decay=0.0,
        eps=eps,
        amsgrad=False,
        maximize=False,
    )
    dest.copy_(w.reshape(-1))


class ZeroAdam(MixedAdam):
    """ZeRO stages 1-3 (Rajbhandari et al. 2020, §5): each rank of the gradient group keeps the fp32
    master, m and v of its 1/n of every weight (the weight flattened, zero-padded to a multiple of n),
    updates them from its shard of the summed gradient (parallelize.GradientSync, which
    reduce-scattered it), and all-gathers the updated bf16 slices into every rank's whole weight —
    or, under ZeRO 3, writes them into the weight's shard, which the next forward gathers. The experts
    an ep axis splits keep 1/edp of their states and gather over edp (GradientSync.group_of).

    The step writes each slice where the gather sends it from (`_dest`): inside the weight's own
    memory, which the all-gather then fills around in place, so that the step allocates nothing — but
    for a weight whose size is not a multiple of the group, gathered into a padded bf16 buffer of its
    size and copied out (at most three such buffers at once). On a GPU the slice's update is the one
    Triton kernel of MixedAdam, reading the gradient shard in bf16."""

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

    def _dest(self, p: torch.Tensor) -> torch.Tensor:
        """Where this rank's updated slice of p goes, in p's dtype: under ZeRO 3 p's shard; for a weight
        whose states are whole here (an expert on one edp rank) p itself; else the slice of p's memory
        that the all-gather sends from and fills around (in place: NCCL's all-gather with the input
        inside the output), or of a padded buffer where p's size is not a multiple of the group."""
        if self.weights is not None:
            return self.weights.shard(p)
        _, n, rank = self.sync.group_of(p)
        if n == 1:
            return p.data.view(-1)
        s = shard_len(p.numel(), n)
        whole = p.data.view(-1) if s * n == p.numel() else torch.empty(s * n, dtype=p.dtype, device=p.device)
        return whole[rank * s : (rank + 1) * s]

    def _wrote(self, p: torch.Tensor, dest: torch.Tensor) -> None:
        if self.weights is not None:
            return
        axis, n, rank = self.sync.group_of(p)
        if n == 1:
            return
        # The gather's output: the group's n slices around dest, in the memory _dest cut it from.
        start, s = dest.storage_offset() - rank * dest.numel(), dest.numel()
        whole = dest.new_empty(0).set_(dest.untyped_storage(), start, (n * s,))
        self.waits.append((all_gather_into_start(self.sync.mesh, whole, dest, axis), p, whole))
        if len(self.waits) > 2:  # two gathers in flight (padded weights: their buffers are the step's transients)
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

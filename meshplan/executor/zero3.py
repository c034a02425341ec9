"""ZeRO stage 3 (Rajbhandari et al. 2020, §5.3): each rank of the gradient group keeps 1/n of every
weight (the weight flattened, zero-padded to a multiple of n); a layer's weights are all-gathered just
before its forward and again just before its backward, and their memory is given back after each.

The whole weight keeps its tensor (autograd saves it for the backward), but its storage is resized to
nothing between uses and refilled by the next gather, as FSDP's first version does with its flat
parameters: the tensors autograd saved see the refilled storage. Gradients are reduce-scattered as
the backward produces them (parallelize.GradientSync, ZeRO 2's path); the optimizer updates the
shards in place (optim.ZeroAdam), with nothing to gather after the step.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from meshplan.executor.comm import Mesh, all_gather_into_start, shard_len, shard_of
from meshplan.layout import grad_group


class ShardedWeights:
    def __init__(self, layers: nn.ModuleList, mesh: Mesh):
        self.mesh = mesh
        self.axis = grad_group(mesh.layout)[0]
        ax = mesh.axis(self.axis)
        self.n, self.rank = ax.size, ax.rank
        self.layers = list(layers)
        self.shards: dict[int, torch.Tensor] = {}
        self.left: dict[int, int] = {}  # a layer's weights whose gradient the backward has yet to finish
        # Hooks on tensors live in C++, out of the collector's sight: they hold this object and the
        # layer weakly (a strong reference to the layer kept every run's weights alive: run 49).
        ref = weakref.ref(self)
        for layer in self.layers:
            for p in layer.parameters():
                self.shards[id(p)] = shard_of(p.detach(), self.n, self.rank).clone()
                p.register_post_accumulate_grad_hook(
                    # `at` binds this iteration's layer, weakly (the hook outlives no module).
                    lambda p, at=weakref.ref(layer): (w := ref()) and w._grad_done(at())  # noqa: B008
                )
            self._free(layer)
            # The layer holds this object (a cycle the collector sees and frees with the layers), so
            # that no caller need keep it; the C++-held gradient hooks above hold it weakly.
            object.__setattr__(layer, "_sharded_weights", self)
            layer.register_forward_pre_hook(lambda m, args: (w := ref()) and w._gather(m))
            layer.register_forward_hook(lambda m, args, out: (w := ref()) and w._after_forward(m, out))
            if hasattr(layer, "decode"):  # decode steps bypass forward: gather around them too
                layer.decode = self._around(layer, layer.decode)

    def shard(self, p: torch.Tensor) -> torch.Tensor:
        """This rank's 1/n of p (flattened, zero-padded): what it keeps between uses."""
        return self.shards[id(p)]

    def _gather(self, layer: nn.Module) -> None:
        waits = []
        for p in layer.parameters():
            s = shard_len(p.numel(), self.n)
            storage = p.data.untyped_storage()
            storage.resize_(s * self.n * p.element_size())
            whole = torch.empty(0, dtype=p.dtype, device=p.device).set_(storage, 0, (s * self.n,))
            waits.append(all_gather_into_start(self.mesh, whole, self.shards[id(p)], self.axis))
        for wait in waits:
            wait()
        self.left[id(layer)] = sum(1 for _ in layer.parameters())

    def _free(self, layer: nn.Module) -> None:
        for p in layer.parameters():
            p.data.untyped_storage().resize_(0)
        self.left.pop(id(layer), None)

    def _after_forward(self, layer: nn.Module, out) -> None:
        if torch.is_grad_enabled() and isinstance(out, torch.Tensor) and out.requires_grad:
            ref, at = weakref.ref(self), weakref.ref(layer)
            out.register_hook(lambda g: (w := ref()) and w._gather(at()))  # the layer's backward begins
        self._free(layer)

    def _grad_done(self, layer: nn.Module) -> None:
        if id(layer) in self.left:
            self.left[id(layer)] -= 1
            if self.left[id(layer)] == 0:  # every weight's gradient is in: the layer's backward is over
                self._free(layer)

    def free_all(self) -> None:
        """After the backward: give back what a layer whose weights all got no gradient still holds."""
        for layer in self.layers:
            if id(layer) in self.left:
                self._free(layer)

    def _around(self, layer: nn.Module, fn):
        def gathered(*args, **kwargs):
            self._gather(layer)
            try:
                return fn(*args, **kwargs)
            finally:
                self._free(layer)

        return gathered

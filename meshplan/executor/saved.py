"""Count the bytes autograd saves for backward, by storage, leaving parameters out."""

from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def count_saved_bytes(exclude: list[torch.Tensor] | tuple = ()):
    """Yields a dict whose 'bytes' is the total size of distinct storages saved for backward
    inside the block (views of one storage count once; `exclude`, e.g. parameters, not at all)."""
    seen: dict[int, int] = {}
    result = {"bytes": 0, "tensors": 0}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        # The excluded storages are looked up as each tensor is saved: under ZeRO 3 a weight's storage
        # is refilled (at a new address) just before the layer that saves it runs.
        if key not in seen and all(e.untyped_storage().data_ptr() != key for e in exclude):
            seen[key] = storage.nbytes()
            result["bytes"] += storage.nbytes()
            result["tensors"] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield result

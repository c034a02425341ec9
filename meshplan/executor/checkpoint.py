"""Real weights: a local HuggingFace safetensors checkpoint read into the sharded model.

Each rank reads only the rows or columns its parameters hold (routed experts split over etp too: their
experts' rows, each expert's FFN slice cut after reading). A sharded module (layouts.common.Sharded)
records, for every local parameter, the reference parameter it slices and the indices it keeps
(`index`); `origin` names the reference module it came from ("stack.layers.3", "embed", "head"). The
table below maps each reference parameter onto the checkpoint's tensors — several concatenated along
the rows where the executor fuses them (Q, K and V into w_qkv; gate and up into w_in) — and the kept
indices become contiguous runs read with safetensors' lazy slices. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from meshplan.errors import MeshplanError
from meshplan.executor.layouts.common import select
from meshplan.models import ModelSpec

# Checkpoint layouts the executor reads, by config.json model_type.
_LLAMA = {
    "attn_norm.weight": ["input_layernorm.weight"],
    "w_qkv": ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"],
    "w_o": ["self_attn.o_proj.weight"],
    "mlp_norm.weight": ["post_attention_layernorm.weight"],
    "w_in": ["mlp.gate_proj.weight", "mlp.up_proj.weight"],
    "w_down": ["mlp.down_proj.weight"],
}
_PHI3 = {**_LLAMA, "w_qkv": ["self_attn.qkv_proj.weight"], "w_in": ["mlp.gate_up_proj.weight"]}
# Qwen3's per-head query and key norms (a (head_dim,) scale each), whole on every rank.
_QK_NORMS = {"q_norm.weight": ["self_attn.q_norm.weight"], "k_norm.weight": ["self_attn.k_norm.weight"]}
_MAMBA2 = {
    "norm.weight": ["norm.weight"],
    "in_proj": ["mixer.in_proj.weight"],
    "conv_w": ["mixer.conv1d.weight"],  # (channels, 1, d_conv) there, (channels, d_conv) here
    "conv_b": ["mixer.conv1d.bias"],
    "dt_bias": ["mixer.dt_bias"],
    "a_log": ["mixer.A_log"],
    "d_skip": ["mixer.D"],
    "norm_w": ["mixer.norm.weight"],
    "out_proj": ["mixer.out_proj.weight"],
}
# Mixtures of experts: attention as Llama's; the experts one tensor each per expert on the Hub and as
# transformers 5 writes them ("{e}": each expert in turn, its rows stacked as the executor's (E, 2f, h)
# and (E, h, f) weights hold them); the packed (E, …) tensors of transformers 5's modules where a
# checkpoint holds those instead (PACKED_EXPERTS).
_ATTENTION = {k: _LLAMA[k] for k in ("attn_norm.weight", "w_qkv", "w_o")}
_MIXTRAL = {
    **_ATTENTION,
    "moe.mlp_norm.weight": ["post_attention_layernorm.weight"],
    "moe.w_router": ["block_sparse_moe.gate.weight"],
    "moe.w_gate_up": ["block_sparse_moe.experts.{e}.w1.weight", "block_sparse_moe.experts.{e}.w3.weight"],
    "moe.w_down": ["block_sparse_moe.experts.{e}.w2.weight"],
}
_QWEN_MOE = {
    **_ATTENTION,
    "moe.mlp_norm.weight": ["post_attention_layernorm.weight"],
    "moe.w_router": ["mlp.gate.weight"],
    "moe.w_gate_up": ["mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight"],
    "moe.w_down": ["mlp.experts.{e}.down_proj.weight"],
    "moe.w_shared_gate_up": ["mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight"],
    "moe.w_shared_down": ["mlp.shared_expert.down_proj.weight"],
    "moe.w_shared_gate": ["mlp.shared_expert_gate.weight"],
}
PACKED_EXPERTS = {
    "block_sparse_moe.experts.{e}.w1.weight": "block_sparse_moe.experts.gate_up_proj",
    "block_sparse_moe.experts.{e}.w2.weight": "block_sparse_moe.experts.down_proj",
    "mlp.experts.{e}.gate_proj.weight": "mlp.experts.gate_up_proj",
    "mlp.experts.{e}.down_proj.weight": "mlp.experts.down_proj",
}
# model_type → (layer table, layer prefix, embedding, final norm).
LAYOUTS = {
    "llama": (_LLAMA, "model.layers", "model.embed_tokens.weight", "model.norm.weight"),
    "qwen3": ({**_LLAMA, **_QK_NORMS}, "model.layers", "model.embed_tokens.weight", "model.norm.weight"),
    "mistral": (_LLAMA, "model.layers", "model.embed_tokens.weight", "model.norm.weight"),
    "phi3": (_PHI3, "model.layers", "model.embed_tokens.weight", "model.norm.weight"),
    "mamba2": (_MAMBA2, "backbone.layers", "backbone.embeddings.weight", "backbone.norm_f.weight"),
    "mixtral": (_MIXTRAL, "model.layers", "model.embed_tokens.weight", "model.norm.weight"),
    "qwen2_moe": (_QWEN_MOE, "model.layers", "model.embed_tokens.weight", "model.norm.weight"),
    "qwen3_moe": ({**_QWEN_MOE, **_QK_NORMS}, "model.layers", "model.embed_tokens.weight", "model.norm.weight"),
}


def checkpoint_names(model_type: str, ref_name: str, tied: bool, experts: int = 0) -> list[str]:
    """The checkpoint tensors whose rows, concatenated, make reference parameter `ref_name` (a name in
    executor.model.CausalLM); a routed expert weight names each of the `experts` experts' tensors in
    turn."""
    layers, prefix, embed, final_norm = LAYOUTS[model_type]
    if ref_name == "embed.weight" or (ref_name == "head.weight" and tied):
        return [embed]
    if ref_name == "head.weight":
        return ["lm_head.weight"]
    if ref_name == "head.final_norm.weight":
        return [final_norm]
    _, _, rest = ref_name.partition("stack.layers.")
    index, _, local = rest.partition(".")
    if not index.isdigit() or local not in layers:
        raise MeshplanError(f"--weights: no checkpoint tensor is known for the executor's {ref_name}")
    names = layers[local]
    if "{e}" in names[0]:
        names = [name.format(e=e) for e in range(experts) for name in names]
    return [f"{prefix}.{index}.{name}" for name in names]


def packed_experts(names: list[str], files) -> str | None:
    """The one packed (E, …) tensor that holds the per-expert tensors `names`, where the checkpoint
    (`files`, its tensor names) has it instead of them; None otherwise."""
    if names[0] in files:
        return None
    for per_expert, packed in PACKED_EXPERTS.items():
        first = per_expert.format(e=0)
        if names[0].endswith(first) and (whole := names[0][: -len(first)] + packed) in files:
            return whole
    return None


def _number(value) -> float:
    """A JSON number, or transformers 5's {"__float__": "Infinity"} for a float JSON cannot write."""
    return float(value["__float__"]) if isinstance(value, dict) and "__float__" in value else float(value)


def _runs(idx: torch.Tensor) -> list[tuple[int, int]]:
    """[start, stop) runs of consecutive values in idx, in its order."""
    values = idx.tolist()
    runs, start = [], values[0]
    for prev, cur in zip(values, values[1:]):
        if cur != prev + 1:
            runs.append((start, prev + 1))
            start = cur
    runs.append((start, values[-1] + 1))
    return runs


class Checkpoint:
    """A folder with config.json and model.safetensors (or shards named by model.safetensors.index.json)."""

    def __init__(self, folder: str | Path):
        from safetensors import safe_open

        self.folder = Path(folder)
        self._open = safe_open
        config = self.folder / "config.json"
        if not config.exists():
            raise MeshplanError(f"--weights: {folder} has no config.json; give the checkpoint's folder")
        raw = json.loads(config.read_text())
        self.model_type = raw.get("model_type")
        if self.model_type not in LAYOUTS:
            raise MeshplanError(
                f"--weights: the executor reads {', '.join(LAYOUTS)} checkpoints, not model_type "
                f"{self.model_type!r}; run it without --weights (random weights)"
            )
        self._check_config(raw)
        index = self.folder / "model.safetensors.index.json"
        if index.exists():
            self.files = {
                name: self.folder / file for name, file in json.loads(index.read_text())["weight_map"].items()
            }
        elif (self.folder / "model.safetensors").exists():
            with safe_open(self.folder / "model.safetensors", "pt") as f:
                self.files = dict.fromkeys(f.keys(), self.folder / "model.safetensors")
        else:
            raise MeshplanError(
                f"--weights: {folder} holds neither model.safetensors nor model.safetensors.index.json "
                f"(.bin checkpoints are not read)"
            )
        self.bytes_read = 0
        self._handles: dict = {}

    def _check_config(self, raw: dict) -> None:
        """Settings that change the function a checkpoint computes and that the executor's blocks do not
        have (a different loss would follow, not an error): refused in one line."""
        where = f"--weights: {self.folder / 'config.json'}"
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise MeshplanError(f"{where}: hidden_act {act!r}; the executor's gated MLP and Mamba-2 gate use silu")
        partial = (raw.get("rope_parameters") or {}).get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
        if partial not in (None, 1.0):
            raise MeshplanError(f"{where}: partial_rotary_factor {partial}; the executor turns whole heads")
        if raw.get("router_jitter_noise", 0.0):
            raise MeshplanError(
                f"{where}: router_jitter_noise {raw['router_jitter_noise']}; the executor's router takes "
                f"its inputs unscaled (0)"
            )
        if self.model_type == "mamba2":
            if raw.get("use_bias", False):
                raise MeshplanError(f"{where}: use_bias true; the executor's in_proj and out_proj have no biases")
            low, high = (_number(v) for v in raw.get("time_step_limit", (0.0, float("inf"))))
            if low > 0 or high != float("inf"):
                raise MeshplanError(
                    f"{where}: time_step_limit {raw['time_step_limit']}; the executor leaves dt "
                    f"unclamped, as mamba_ssm's default"
                )
            if raw.get("layer_norm_epsilon", 1e-5) != 1e-5:
                raise MeshplanError(
                    f"{where}: layer_norm_epsilon {raw['layer_norm_epsilon']}; the executor's gated "
                    f"norm takes mamba_ssm's 1e-5"
                )

    def _slice(self, name: str):
        if name not in self.files:
            raise MeshplanError(f"--weights: {self.folder} has no tensor {name}; is it a {self.model_type} checkpoint?")
        file = self.files[name]
        if file not in self._handles:
            self._handles[file] = self._open(file, "pt")
        return self._handles[file].get_slice(name)

    def read(self, names: list[str], dim: int | None, idx: torch.Tensor | None, shape: torch.Size) -> torch.Tensor:
        """The rows (dim 0) or columns (dim 1) `idx` of the named tensors stacked along their rows, or all
        of it (dim None), reshaped to `shape` (the local parameter's)."""
        parts = [(sl, sl.get_shape()) for sl in map(self._slice, names)]
        lengths = [s[0] for _, s in parts]
        if dim is None or (dim == 1 and len(parts) == 1):
            got = [sl[:] if dim is None else torch.cat([sl[:, a:b] for a, b in _runs(idx)], 1) for sl, _ in parts]
            out = torch.cat(got, 0) if len(got) > 1 else got[0]
        elif dim == 0:
            pieces, offsets = [], [0]
            for n in lengths:
                offsets.append(offsets[-1] + n)
            for a, b in _runs(idx):
                for (sl, _), lo, hi in zip(parts, offsets, offsets[1:]):
                    s, e = max(a, lo), min(b, hi)
                    if s < e:
                        pieces.append(sl[s - lo : e - lo])
            out = torch.cat(pieces, 0)
        else:
            raise MeshplanError(f"--weights: cannot read columns across the fused tensors {', '.join(names)}")
        if out.numel() != shape.numel():
            raise MeshplanError(
                f"--weights: {', '.join(names)} give {out.numel()} values where the model needs "
                f"{tuple(shape)}; does --model describe this checkpoint?"
            )
        self.bytes_read += out.numel() * out.element_size()
        return out.reshape(shape)

    def close(self) -> None:
        self._handles.clear()


def load_into(modules, folder: str | Path, model: ModelSpec) -> int:
    """Fill `modules` — sharded ones (with `origin` and `index`) or a whole reference CausalLM — from
    the checkpoint in `folder`, each parameter reading only its slice. Returns the bytes read."""
    ckpt = Checkpoint(folder)
    try:
        for module in modules:
            for local, ref_name, dim, idx in _targets(module):
                param = module.get_parameter(local)
                experts = model.moe.experts if model.moe is not None else 0
                names = checkpoint_names(ckpt.model_type, ref_name, model.tied_embeddings, experts)
                if len(names) > 1 and param.dim() == 3 and isinstance(dim, tuple):
                    # routed experts split over ep and etp: this rank's experts read, their FFN slice cut here
                    value = _read_expert_slices(ckpt, names, experts, dim, idx)
                elif len(names) > 1 and param.dim() == 3:  # routed experts, one tensor each
                    names, dim, idx = _expert_rows(names, ckpt.files, param.shape[1], dim, idx)
                    value = ckpt.read(names, dim, idx, param.shape)
                else:
                    value = ckpt.read(names, dim, idx, param.shape)
                with torch.no_grad():
                    param.copy_(value)
    finally:
        ckpt.close()
    return ckpt.bytes_read


def _read_expert_slices(ckpt: Checkpoint, names: list[str], experts: int, dims: tuple, idx: tuple) -> torch.Tensor:
    """A 3-D expert weight's experts idx[0] (dims[0] = 0) read whole, then cut along the other dims
    (an expert's FFN slice over etp): the checkpoint gives the experts' rows, not their columns, so a
    rank reads its experts' every FFN column (etp times its share of them; bytes_read counts what it read)."""
    if dims[0] != 0:
        raise MeshplanError(f"--weights: cannot read the experts' {', '.join(names[:2])}, … split along dim {dims[0]}")
    packed = packed_experts(names, ckpt.files)
    if packed is not None:
        rest = tuple(ckpt._slice(packed).get_shape()[1:])
    else:
        shapes = [ckpt._slice(name).get_shape() for name in names[: len(names) // experts]]
        rest = (sum(s[0] for s in shapes), shapes[0][1])
    shape = torch.Size((len(idx[0]), *rest))
    names, dim, rows = _expert_rows(names, ckpt.files, rest[0], 0, idx[0])
    return select(ckpt.read(names, dim, rows, shape), dims[1:], idx[1:])


def _expert_rows(names: list[str], files, rows: int, dim: int | None, idx: torch.Tensor | None):
    """(names, dim, indices) that read the experts `idx` (all where dim is None) of a 3-D expert weight:
    the packed (E, …) tensor's entries where the checkpoint holds one, else the rows of the per-expert
    tensors stacked (each expert's `rows` rows in turn)."""
    if dim not in (None, 0):
        raise MeshplanError(f"--weights: cannot read the experts' {', '.join(names[:2])}, … split along dim {dim}")
    packed = packed_experts(names, files)
    if packed is not None:
        return [packed], dim, idx
    if dim is None:
        return names, None, None
    return names, 0, (idx[:, None] * rows + torch.arange(rows)).reshape(-1)


def _targets(module: nn.Module):
    """(local parameter name, reference name, dim, indices) of each parameter `module` holds."""
    index = getattr(module, "index", None)
    if index is None:  # a reference module: every parameter whole, under its own name
        for name, _ in module.named_parameters():
            yield name, name, None, None
        return
    for local, (ref_name, dim, idx) in index.items():
        yield local, f"{module.origin}.{ref_name}", dim, idx

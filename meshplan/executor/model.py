"""The whole model on one process: token embedding → the layer stack → final norm → LM head → loss.

The plain reference the sharded whole model (meshplan.executor.layouts.vocab, parallelize_model) is
checked against: it materializes every logit and takes torch's own cross-entropy. Tied embeddings
share one matrix between the embedding and the head (the same Parameter in both modules).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from meshplan.executor.blocks import RMSNorm, Stack, _init
from meshplan.kernels.reference import acc
from meshplan.models import ModelSpec


class TokenEmbedding(nn.Module):
    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.weight = _init(vocab, hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.weight)


class OutputHead(nn.Module):
    """Final RMSNorm and the vocab × hidden output matrix (the embedding's, when tied)."""

    def __init__(self, model: ModelSpec, tied_to: TokenEmbedding | None = None):
        super().__init__()
        self.final_norm = RMSNorm(model.d_model, model.norm_eps)
        self.weight = tied_to.weight if tied_to is not None else _init(model.vocab, model.d_model)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(self.final_norm(h), self.weight)


class CausalLM(nn.Module):
    """Tokens in, per-token cross-entropy (or the next token's log-probabilities) out."""

    def __init__(self, model: ModelSpec, n_layers: int | None = None, recompute: str = "none", flash: bool = True):
        super().__init__()
        self.embed = TokenEmbedding(model.vocab, model.d_model)
        self.stack = Stack(model, model.layers if n_layers is None else n_layers, recompute, flash)
        self.head = OutputHead(model, self.embed if model.tied_embeddings else None)

    def hidden(self, tokens: torch.Tensor, seq_idx: torch.Tensor | None = None) -> torch.Tensor:
        return self.stack(self.embed(tokens), seq_idx)

    def token_losses(
        self, tokens: torch.Tensor, labels: torch.Tensor, seq_idx: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(b, s) cross-entropy of each position's prediction of its label, in fp32 (float64 stays).
        `seq_idx` (b, s): the document of each token, where documents are packed."""
        logits = self.head.logits(self.hidden(tokens, seq_idx))
        return F.cross_entropy(acc(logits).flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape)

    def next_token_logprobs(self, tokens: torch.Tensor, seq_idx: torch.Tensor | None = None) -> torch.Tensor:
        """(b, vocab) log-probabilities of the token after the last."""
        return torch.log_softmax(acc(self.head.logits(self.hidden(tokens, seq_idx)[:, -1])), dim=-1)


def synthetic_tokens(
    vocab: int, batch: int, seq: int, *, generator: torch.Generator | None = None, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, labels) of `batch` sequences of `seq` uniform random token ids; each label is the next
    token (the one past the end drawn too)."""
    ids = torch.randint(0, vocab, (batch, seq + 1), generator=generator, device=device)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def tokens_from_file(path: str, vocab: int, batch: int, seq: int) -> tuple:
    """(tokens, labels, documents) from a .npy array of token ids, or from a .npz with arrays `tokens`
    and `documents` (each token's document id, non-decreasing along a row: packed documents, which the
    Mamba-2 blocks keep apart): `batch` rows of seq + 1 ids, each row's labels its next ids; documents
    is None for a .npy. A 1-D array is one stream of ids, cut into rows; a 2-D array is rows of ids
    (sequences × tokens), each row's first seq + 1 taken. A short file, an array of more dimensions,
    an id past the vocabulary or documents out of order is a MeshplanError."""
    import numpy as np

    from meshplan.errors import MeshplanError

    try:
        data = np.load(path, allow_pickle=False)
        if isinstance(data, np.lib.npyio.NpzFile):
            missing = {"tokens", "documents"} - set(data.files)
            if missing:
                raise MeshplanError(
                    f"--tokens: {path} lacks the array(s) {', '.join(sorted(missing))}; a .npz "
                    f"holds `tokens` and `documents` (each token's document id)"
                )
            ids, docs = data["tokens"], data["documents"]
        else:
            ids, docs = data, None
    except (OSError, ValueError) as exc:
        raise MeshplanError(f"--tokens: cannot read {path} as a .npy or .npz array of token ids ({exc})") from None
    if ids.ndim > 2:
        raise MeshplanError(
            f"--tokens: {path} holds a {ids.ndim}-D array of shape {tuple(ids.shape)}; give a 1-D stream of "
            f"ids or a 2-D array of rows (sequences × tokens)"
        )
    if docs is not None and docs.shape != ids.shape:
        raise MeshplanError(
            f"--tokens: {path}'s documents have shape {tuple(docs.shape)} and its tokens {tuple(ids.shape)}; "
            f"give one document id per token"
        )
    if ids.ndim == 2 and ids.shape[0] > 1:
        if ids.shape[0] < batch or ids.shape[1] < seq + 1:
            raise MeshplanError(
                f"--tokens: {path} holds {ids.shape[0]} rows of {ids.shape[1]} ids; batch {batch} × "
                f"(seq {seq} + 1) needs {batch} rows of at least {seq + 1}"
            )
        ids = ids[:batch, : seq + 1]
        docs = docs[:batch, : seq + 1] if docs is not None else None
    ids = ids.reshape(-1)
    docs = docs.reshape(-1) if docs is not None else None
    need = batch * (seq + 1)
    if ids.size < need:
        raise MeshplanError(f"--tokens: {path} holds {ids.size} ids; batch {batch} × (seq {seq} + 1) needs {need}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise MeshplanError(f"--tokens: {path} holds {ids.dtype} values; token ids must be integers")
    rows = torch.from_numpy(ids[:need].astype("int64")).view(batch, seq + 1)
    if int(rows.min()) < 0 or int(rows.max()) >= vocab:
        raise MeshplanError(
            f"--tokens: ids in {path} run from {int(rows.min())} to {int(rows.max())}; "
            f"the model's vocabulary is 0..{vocab - 1}"
        )
    documents = None
    if docs is not None:
        if docs.size != ids.size or not np.issubdtype(docs.dtype, np.integer):
            raise MeshplanError(
                f"--tokens: {path}'s documents must be integers, one per token ({docs.size} for {ids.size} tokens)"
            )
        documents = torch.from_numpy(docs[:need].astype("int32")).view(batch, seq + 1)[:, :-1].contiguous()
        if bool((documents[:, 1:] < documents[:, :-1]).any()):
            raise MeshplanError(f"--tokens: {path}'s document ids decrease along a row; number documents in order")
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous(), documents

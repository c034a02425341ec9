"""Pack variable-length sequences into rows (first fit, longest first) with `seq_idx`, and back.

seq_idx numbers the sequences within each row from 0; padding at a row's end gets its own number
(one past the last sequence), so no real token ever attends across it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Packed:
    rows: torch.Tensor  # (n_rows, row_len, ...)
    seq_idx: torch.Tensor  # (n_rows, row_len) int32
    places: tuple[tuple[int, int, int], ...]  # per input sequence: (row, start, length)


def pack(seqs: list[torch.Tensor], row_len: int) -> Packed:
    if not seqs:
        raise ValueError("pack: no sequences")
    for i, s in enumerate(seqs):
        if not 1 <= s.shape[0] <= row_len:
            raise ValueError(f"pack: sequence {i} has length {s.shape[0]}; lengths must be 1..row_len ({row_len})")
    order = sorted(range(len(seqs)), key=lambda i: -seqs[i].shape[0])
    fill: list[int] = []
    places: list[tuple[int, int, int] | None] = [None] * len(seqs)
    for i in order:
        n = seqs[i].shape[0]
        row = next((r for r, used in enumerate(fill) if used + n <= row_len), None)
        if row is None:
            fill.append(0)
            row = len(fill) - 1
        places[i] = (row, fill[row], n)
        fill[row] += n
    tail = seqs[0].shape[1:]
    rows = seqs[0].new_zeros(len(fill), row_len, *tail)
    seq_idx = torch.zeros(len(fill), row_len, dtype=torch.int32)
    counts = [0] * len(fill)
    for i in sorted(range(len(seqs)), key=lambda i: places[i][:2]):
        row, start, n = places[i]
        rows[row, start : start + n] = seqs[i]
        seq_idx[row, start : start + n] = counts[row]
        counts[row] += 1
    for row, used in enumerate(fill):
        seq_idx[row, used:] = counts[row]
    return Packed(rows, seq_idx.to(rows.device), tuple(places))


def unpack(rows: torch.Tensor, packed: Packed) -> list[torch.Tensor]:
    """Cut per-token outputs of packed rows back into the input sequences, in input order."""
    return [rows[row, start : start + n] for row, start, n in packed.places]

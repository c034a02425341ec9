"""Plots drawn from result records (never from numbers typed by hand)."""

from __future__ import annotations

from collections import defaultdict


def plot_memory_vs_seq(records: list[dict], path: str) -> None:
    """Per-GPU memory against sequence length, one line per layout; the GPU's memory if known."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_layout: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in records:
        by_layout[r["layout"]].append((r["seq"], r["total_bytes"] / 2**30))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in by_layout.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    if "gpu_memory_bytes" in records[0]:
        ax.axhline(
            records[0]["gpu_memory_bytes"] / 2**30,
            color="grey",
            linestyle="--",
            label=f"{records[0]['cluster']} GPU memory",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("per-GPU memory (GiB)")
    ax.set_title(f"{records[0]['model']} · {records[0]['mode']} · batch {records[0]['batch']}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

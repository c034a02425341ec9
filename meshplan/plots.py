"""Plots drawn from result records (never from numbers typed by hand)."""

from __future__ import annotations

from pathlib import Path

from meshplan.errors import MeshplanError

# Components as the plot stacks them (memory records' at_peak_bytes): model states first, then what
# the peak moment adds. Labels a reader knows without the README.
PLOT_COMPONENTS = (
    ("parameters", "weights", "#1f77b4"),
    ("gradients", "gradients", "#9467bd"),
    ("optimizer_state", "optimizer state (Adam)", "#2ca02c"),
    ("activations", "activations saved for backward", "#ff7f0e"),
    ("kv_cache", "KV cache", "#8c564b"),
    ("ssm_state_cache", "SSM state cache", "#e377c2"),
    ("transient_working", "a layer's working tensors", "#7f7f7f"),
    ("transient_kv_gather", "K/V gathered across sequence shards", "#17becf"),
    ("transient_weight_shards", "weight shards gathered (TSP / ZeRO-3)", "#bcbd22"),
    ("transient_comm_buffers", "ZeRO-3 gather buffers", "#d62728"),
    ("transient_logits", "logits", "#aec7e8"),
    ("blas_workspace", "cuBLAS workspace", "#c7c7c7"),
    ("int8_peer_buffer", "int8 all-reduce buffer", "#ffbb78"),
)


def check_plot_path(flag: str, path: str) -> None:
    """A file name whose extension matplotlib writes, before any work is done."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in formats:
        ends = f"ends in .{suffix}" if suffix else "has no extension"
        raise MeshplanError(
            f"{flag}: {path} {ends}, which is not an image format; end the name in .png, .pdf or .svg "
            f"(or {', '.join('.' + f for f in sorted(formats) if f not in ('png', 'pdf', 'svg'))})"
        )


def token_label(n: int) -> str:
    """8192 → '8K', 1048576 → '1M', 3000 → '3000': tokens as a practitioner writes them."""
    for unit, size in (("M", 1024**2), ("K", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n:,}"


def describe_assumptions(record: dict) -> str:
    """One line of what a memory record assumed (its stack and knobs)."""
    a = record["assumptions"]
    parts = [
        f"stack {a['stack']}",
        f"{a['mode']}",
        f"batch {record['batch']}",
        f"grads {a['grad_dtype']}" if a["mode"] == "train" else None,
        f"optimizer {a['optimizer']}" if a["mode"] == "train" else None,
        f"activations {a['act_dtype']}",
        f"recompute {a['recompute']}" if a["mode"] == "train" else None,
        f"Megatron-SP {'on' if a['tp_sequence_parallel'] else 'off'}",
        "flash attention" if a["flash_attention"] else "unfused attention",
        "int8 all-reduce" if a.get("int8_allreduce") else None,
    ]
    return ", ".join(p for p in parts if p)


def plot_memory_vs_seq(records: list[dict], path: str) -> None:
    """memory_figure(records), written to `path`."""
    import matplotlib.pyplot as plt

    fig = memory_figure(records)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def memory_figure(records: list[dict]):
    """Per-GPU memory at its peak against sequence length: for each length a bar per layout, stacked by
    component (records' at_peak_bytes, which sum to the total), the GPU's capacity as a line, and what
    the numbers assume in the caption."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gib = 2**30
    seqs = sorted({r["seq"] for r in records})
    layouts = list(dict.fromkeys(r["layout"] for r in records))
    by_key = {(r["layout"], r["seq"]): r for r in records}
    shown = [c for c in PLOT_COMPONENTS if any(r["at_peak_bytes"].get(c[0]) for r in records)]
    width = 0.8 / len(layouts)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.1 * len(seqs) * len(layouts) + 3), 5.2))
    for j, name in enumerate(layouts):
        for i, seq in enumerate(seqs):
            r = by_key.get((name, seq))
            if r is None:
                continue
            x = i - 0.4 + width * (j + 0.5)
            bottom = 0.0
            for k, _, color in shown:
                height = r["at_peak_bytes"].get(k, 0) / gib
                if height:
                    ax.bar(x, height, width * 0.92, bottom=bottom, color=color, edgecolor="white", linewidth=0.4)
                bottom += height
            beside = r.get("outside_allocator_bytes", 0) / gib  # the CUDA context and NCCL's buffers
            if beside:
                ax.bar(x, beside, width * 0.92, bottom=bottom, color="lightgrey", edgecolor="white", linewidth=0.4)
                bottom += beside
            over = "gpu_memory_bytes" in r and not r["fits"]
            ax.annotate(
                f"{name}\n{bottom:.1f}" + (" ✗" if over else ""),
                (x, bottom),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=7,
                color="firebrick" if over else "black",
            )
    for _, label, color in shown:  # one legend entry per component, in stacking order
        ax.bar(0, 0, color=color, label=label)
    if any(r.get("outside_allocator_bytes") for r in records):
        ax.bar(0, 0, color="lightgrey", label="beside the allocator (CUDA context, NCCL)")
    top = max(r["total_bytes"] + r.get("outside_allocator_bytes", 0) for r in records) / gib
    if "gpu_memory_bytes" in records[0]:
        cap = records[0]["gpu_memory_bytes"] / gib
        top = max(top, cap)
        ax.axhline(cap, color="black", linestyle="--", linewidth=1)
        ax.annotate(
            f"GPU memory ({records[0]['cluster']}): {cap:.0f} GiB",
            (0.0, cap),
            xycoords=("axes fraction", "data"),
            xytext=(4, 3),
            textcoords="offset points",
            ha="left",
            fontsize=8,
        )
    ax.set_ylim(0, top * 1.15)
    ax.set_xticks(range(len(seqs)), [token_label(s) for s in seqs])
    ax.set_xlim(-0.6, len(seqs) - 0.4)
    ax.set_xlabel("sequence length (tokens; K = 1024)")
    ax.set_ylabel("memory per GPU at its peak (GiB)")
    r0 = records[0]
    ax.set_title(f"{r0['model']} · {r0['mode']} · batch {r0['batch']}: memory a GPU holds, by component")
    ax.grid(True, axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    caption = (
        f"Assumed: {describe_assumptions(records[0])}. Each bar is what one GPU holds at its peak moment "
        f"(its components sum to the total); above each bar its layout and total GiB, ✗ where it does not fit. "
        f"Made by `meshplan memory`."
    )
    fig.text(0.01, 0.01, caption, fontsize=7, ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig

"""The `meshplan` command: parse options into specs, call one function, render a table or JSON."""

from __future__ import annotations

import functools
import itertools
import json
import sys
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from meshplan.errors import MeshplanError, read_json

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Plan, predict and run parallel layouts for transformer and Mamba models.",
)
cluster_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Inspect cluster descriptions.")
app.add_typer(cluster_app, name="cluster")

# Piped output (logs, CI) gets a wide fixed width so the per-component table is not folded.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


STACK_HELP = (
    "Whose kernels and overlap rules: megatron (Megatron-Core with Transformer Engine, the default) | "
    "megatron-2021 | deepspeed | llama3 | meshplan (this project's executor, as its runs calibrate it)."
)


def _at_least(flag: str, value: int, low: int) -> None:
    """A numeric option below its least sensible value: one line naming it and the bound."""
    if value < low:
        raise MeshplanError(f"{flag} must be >= {low}, got {value}")


def _at_least_float(flag: str, value: float, low: float) -> None:
    if not value >= low:  # NaN too
        raise MeshplanError(f"{flag} must be >= {low:g}, got {value:g}")


def _positive_seconds(flag: str, value: float) -> None:
    if not value > 0:
        raise MeshplanError(f"{flag} must be a positive number of seconds, got {value:g}")


def user_errors(fn):
    """A MeshplanError becomes one line on stderr and exit status 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MeshplanError as exc:
            # The message is printed as written: a "[gpu]" in it is a TOML table, not Rich markup.
            err_console.print(Text.assemble(("error:", "bold red"), f" {exc}"), highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def fmt_bytes(n: float) -> str:
    if n == 0:
        return "0"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def fmt_params(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


# -- memory -------------------------------------------------------------------------------------

COMPONENT_LABELS = {
    "parameters": "params",
    "gradients": "grads",
    "optimizer_state": "optim",
    "activations": "acts",
    "kv_cache": "KV$",
    "ssm_state_cache": "SSM$",
    "transient_working": "work",
    "transient_kv_gather": "KVgath",
    "transient_weight_shards": "shards",
    "transient_comm_buffers": "Z3gath",
    "transient_logits": "logits",
    "blas_workspace": "BLAS",
    "int8_peer_buffer": "int8buf",
    "fp8_weights": "fp8W",
}


# What each memory column holds, for the legend under the table (docs/design.md §3 has the formulas).
COMPONENT_MEANINGS = {
    "parameters": "weights",
    "gradients": "gradients (the grads dtype)",
    "optimizer_state": "Adam's fp32 master weights and two moments",
    "activations": "activations saved for backward",
    "kv_cache": "attention KV cache",
    "ssm_state_cache": "Mamba state cache",
    "transient_working": "one layer's working tensors",
    "transient_kv_gather": "K/V gathered from the sequence shards",
    "transient_weight_shards": "weight shards gathered for a layer (TSP, ZeRO-3)",
    "transient_comm_buffers": "ZeRO-3 gather buffers",
    "transient_logits": "the output layer's logits",
    "blas_workspace": "cuBLAS workspaces",
    "int8_peer_buffer": "the int8 all-reduce's peer buffer",
    "fp8_weights": "Transformer Engine's FP8 weight copies and transposes (--precision fp8)",
}


def memory_legend(shown: list[str]) -> str:
    parts = [f"{COMPONENT_LABELS[k]} = {COMPONENT_MEANINGS[k]}" for k in shown]
    return "legend: " + "; ".join(parts) + "; GiB = 2^30 bytes; seq in tokens (k = 1024, m = 1024²)"


# Mixtures of experts (meshplan.costmodel.axes.ep): the same options in memory, predict and recommend.
MOE_DISPATCHER = typer.Option(
    "alltoall", "--moe-dispatcher", help="Mixture of experts: alltoall | allgather | deepep (how tokens reach experts)."
)
CAPACITY_FACTOR = typer.Option(
    0.0, "--capacity-factor", help="Token drop: an expert takes at most this × its even share (0: dropless)."
)
MOE_PAD = typer.Option(
    False, "--moe-pad-to-capacity/--no-moe-pad-to-capacity", help="Token drop padded: every expert runs its capacity."
)
MOE_IMBALANCE = typer.Option(
    1.0, "--moe-imbalance", help="Dropless: the busiest expert rank's routed tokens over the even share (1: balanced)."
)
DEEPEP_NODE_LIMIT = typer.Option(
    False, "--deepep-node-limit/--no-deepep-node-limit", help="deepep: a token's experts on at most 4 nodes."
)
# FP8 (meshplan.costmodel.options.CostOptions.precision): the same options in memory, predict and recommend.
CP_COMM_TYPE = typer.Option(
    "",
    "--cp-comm-type",
    help="Context parallelism's K/V exchange (sp > 1): allgather | p2p (a ring beside the attention: "
    "Megatron's default) | a2a (Ulysses: heads for sequence). Default: as the stack does.",
)
PRECISION = typer.Option(
    "bf16",
    "--precision",
    help="Linear layers' GEMMs: bf16 | fp8 (Transformer Engine, per-tensor scales) | mxfp8 (Blackwell).",
)
RECOMPUTE_MODULES = typer.Option(
    "",
    "--recompute-modules",
    help="With --recompute selective, what it redoes, in Megatron-Core's names: core_attn (the default), moe "
    "(the whole MoE layer), layernorm (the MoE pre-norm), moe_act (the experts' activation), shared_experts, mlp; "
    "comma list.",
)
FP8_RECIPE = typer.Option(
    "delayed",
    "--fp8-recipe",
    help="Per-tensor FP8 scaling (Megatron-Core --fp8-recipe): delayed (TE's default) | current (an amax "
    "pass a tensor).",
)
FP8_PARAM_GATHER = typer.Option(
    False,
    "--fp8-param-gather/--no-fp8-param-gather",
    help="FP8 weights kept and all-gathered in FP8 (Megatron-Core --fp8-param-gather; needs --precision fp8).",
)
MOE_A2A_OVERLAP = typer.Option(
    False, "--moe-a2a-overlap/--no-moe-a2a-overlap", help="Megatron-Core's 1F1B overlap of the experts' all-to-all."
)


@app.command()
@user_errors
def memory(
    model: str = typer.Option(..., "--model", help="Preset name or path to a HuggingFace config.json."),
    layout: List[str] = typer.Option(..., "--layout", help="e.g. tp=8, tsp=8, tp=2,sp=4 (repeat to compare)."),
    seq: str = typer.Option("4096", "--seq", help="Sequence length (context length in decode): 4096, 128k."),
    batch: int = typer.Option(1, "--batch", help="Micro-batch size in sequences."),
    mode: str = typer.Option("train", "--mode", help="train | prefill | decode"),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="Preset or TOML: check the fit, and the GPU count."),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="Replicate the cluster's node N times."),
    stack: str = typer.Option("megatron", "--stack", help=STACK_HELP + " Sets the defaults below."),
    recompute: str = typer.Option("none", "--recompute", help="none | selective | full"),
    recompute_modules: str = RECOMPUTE_MODULES,
    flash: Optional[bool] = typer.Option(
        None, "--flash/--no-flash", help="Fused attention, no s² scores kept (default: as the stack runs attention)."
    ),
    dropout: bool = typer.Option(False, "--dropout/--no-dropout", help="Count dropout masks."),
    act_dtype: str = typer.Option("bf16", "--act-dtype"),
    grad_dtype: Optional[str] = typer.Option(
        None,
        "--grad-dtype",
        help="bf16 (16 B/param with Adam) or fp32 (18); default: the stack's (fp32 under megatron).",
    ),
    optimizer: str = typer.Option("adam", "--optimizer", help="adam (mixed precision) | none"),
    logits_dtype: str = typer.Option("fp32", "--logits-dtype"),
    tp_sequence_parallel: Optional[bool] = typer.Option(
        None,
        "--tp-sequence-parallel/--no-tp-sequence-parallel",
        help="Megatron-SP on the TP axis (default: the stack's; on under megatron).",
    ),
    int8_allreduce: bool = typer.Option(
        False,
        "--int8-allreduce/--no-int8-allreduce",
        help="TP-SSM: int8-quantized block all-reduce (2 ranks: its peer buffer).",
    ),
    moe_dispatcher: str = MOE_DISPATCHER,
    capacity_factor: float = CAPACITY_FACTOR,
    moe_pad_to_capacity: bool = MOE_PAD,
    moe_imbalance: float = MOE_IMBALANCE,
    deepep_node_limit: bool = DEEPEP_NODE_LIMIT,
    moe_a2a_overlap: bool = MOE_A2A_OVERLAP,
    precision: str = PRECISION,
    cp_comm_type: str = CP_COMM_TYPE,
    fp8_param_gather: bool = FP8_PARAM_GATHER,
    fp8_recipe: str = FP8_RECIPE,
    sweep_seq: Optional[str] = typer.Option(None, "--sweep-seq", help="Comma list, e.g. 16k,32k,64k,128k."),
    plot: Optional[str] = typer.Option(
        None, "--plot", help="Write memory by component against sequence length to this image (.png, .pdf, .svg)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    """Per-GPU memory, broken down, for one or more layouts (a dry run: nothing is allocated)."""
    from meshplan.hf_config import load_model
    from meshplan.layout import parse_layout, validate_int8_allreduce
    from meshplan.reports import memory_records, parse_token_list, parse_tokens
    from meshplan.topologies.cluster import load_cluster

    _at_least("--batch", batch, 1)
    spec = load_model(model)
    layouts = [parse_layout(text) for text in layout]
    seqs = parse_token_list(sweep_seq) if sweep_seq else [parse_tokens(seq)]
    if plot:
        from meshplan.plots import check_plot_path

        _check_folder("--plot", plot)
        check_plot_path("--plot", plot)
    if int8_allreduce:
        validate_int8_allreduce(layouts, spec)
    opts = stack_options(
        stack,
        mode=mode,
        recompute=recompute,
        recompute_modules=recompute_modules,
        flash=flash,
        dropout=dropout,
        act_dtype=act_dtype,
        grad_dtype=grad_dtype,
        optimizer=optimizer,
        logits_dtype=logits_dtype,
        tp_sequence_parallel=tp_sequence_parallel,
        int8_allreduce=int8_allreduce,
        moe=moe_options(
            moe_dispatcher, capacity_factor, moe_pad_to_capacity, moe_imbalance, deepep_node_limit, moe_a2a_overlap
        ),
        precision=precision,
        fp8_param_gather=fp8_param_gather,
        fp8_recipe=fp8_recipe,
        cp_comm_type=cp_comm_type,
    )
    cluster_spec = load_cluster(cluster, nodes) if cluster else None
    records = memory_records(spec, layouts, seqs, batch, opts, cluster_spec)
    if plot:
        from meshplan.plots import plot_memory_vs_seq

        plot_memory_vs_seq(records, plot)
    if as_json:
        _print_json(records[0] if len(records) == 1 else records)
        return
    _render_memory(records, spec, opts, cluster_spec)
    if plot:
        console.print(f"plot written to {plot}")


def fmt_tokens(n: int) -> str:
    for unit, size in (("m", 1024**2), ("k", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _render_memory(records, spec, opts, cluster_spec) -> None:
    shown = [k for k in COMPONENT_LABELS if any(r["per_gpu_bytes"][k] for r in records)]
    gib = 2**30
    title = f"{spec.name} · {opts.mode} · batch {records[0]['batch']} · stack {opts.stack} · per-GPU memory (GiB)"
    table = Table(
        title=title,
        caption="total = params + optim + caches + BLAS (+ int8buf) + the largest phase: a layer (acts, "
        "the grads built so far, its transients; in training the MLP's work and the "
        "attention's KVgath peak apart), the logits or the optimizer step; beside = what the GPU holds "
        "outside PyTorch's allocator (the CUDA context, NCCL's buffers), counted in fits",
        pad_edge=False,
    )
    table.add_column("layout")
    table.add_column("seq", justify="right")
    for key in shown:
        table.add_column(COMPONENT_LABELS[key], justify="right")
    table.add_column("total", justify="right", style="bold")
    if cluster_spec:
        table.add_column("+ beside", justify="right")
        table.add_column(f"fits {cluster_spec.gpu.memory_bytes / gib:.0f}", justify="center")
    for r in records:
        row = [r["layout"], fmt_tokens(r["seq"])] + [f"{r['per_gpu_bytes'][k] / gib:.2f}" for k in shown]
        row.append(f"{r['total_bytes'] / gib:.2f}")
        if cluster_spec:
            row.append(f"{r['outside_allocator_bytes'] / gib:.2f}")
            row.append("[green]yes[/]" if r["fits"] else "[red]no[/]")
        table.add_row(*row)
    console.print(table)
    a = records[0]["assumptions"]
    console.print(
        f"assumed: {fmt_assumed(opts)}, dropout {'on' if a['dropout'] else 'off'}, optimizer {a['optimizer']}, "
        f"logits {a['logits_dtype']} (--stack sets grads, Megatron-SP and attention; an option overrides it)",
        highlight=False,
    )
    console.print(memory_legend(shown), highlight=False)


# -- recommend and crossover ------------------------------------------------------------------------


def stack_options(
    stack: str,
    *,
    mode: str = "train",
    recompute: str = "none",
    recompute_modules: str = "",
    flash: Optional[bool] = None,
    grad_dtype: Optional[str] = None,
    tp_sequence_parallel: Optional[bool] = None,
    int8_allreduce: bool = False,
    global_batch: int = 0,
    microbatches: int = 0,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    stage_layers: str = "",
    pipeline_layout: str = "",
    first_stage_layers: int = 0,
    last_stage_layers: int = 0,
    account_for_embedding: bool = False,
    account_for_loss: bool = False,
    launch_floor: bool = True,
    sp_split: str = "zigzag",
    dropout: bool = False,
    act_dtype: str = "bf16",
    optimizer: Optional[str] = None,
    logits_dtype: str = "fp32",
    moe: dict | None = None,
    precision: str = "bf16",
    fp8_param_gather: bool = False,
    fp8_recipe: str = "delayed",
    cp_comm_type: str = "",
):
    """CostOptions for a stack, as every command builds them: where an option is not given (None), the
    stack's own — flash attention, the gradients' dtype, Megatron-SP on the TP axis — so that one
    layout costs the same in `memory`, `predict` and `recommend`. `moe`: the mixture-of-experts
    options (CostOptions' moe_* fields)."""
    from meshplan.costmodel.options import CostOptions
    from meshplan.costmodel.stacks import get_stack

    spec = get_stack(stack)
    if sp_split not in ("zigzag", "contiguous"):
        raise MeshplanError(f"--sp-split: use zigzag or contiguous, not {sp_split!r}")
    if tp_sequence_parallel is None:
        # The int8 all-reduce quantizes the all-reduce that Megatron-SP replaces by a reduce-scatter.
        tp_sequence_parallel = spec.tp_sequence_parallel and not int8_allreduce
    elif tp_sequence_parallel and int8_allreduce:
        raise MeshplanError(
            "--int8-allreduce quantizes TP-SSM's all-reduce, which --tp-sequence-parallel replaces by a "
            "reduce-scatter; drop one of them"
        )
    if virtual_stages > 1 and schedule == "1f1b":
        schedule = "interleaved"  # --virtual-stages alone asks for the interleaved schedule
    modules = tuple(m.strip() for m in recompute_modules.split(",") if m.strip()) or ("core_attn",)
    return CostOptions(
        mode=mode,
        recompute=recompute,
        recompute_modules=modules,
        flash_attention=spec.flash_attention if flash is None else flash,
        dropout=dropout,
        act_dtype=act_dtype,
        grad_dtype=grad_dtype or spec.grad_dtype,
        optimizer=optimizer or ("adam" if mode == "train" else "none"),
        logits_dtype=logits_dtype,
        tp_sequence_parallel=tp_sequence_parallel,
        int8_allreduce=int8_allreduce,
        microbatches=microbatches,
        launch_floor=launch_floor,
        sp_zigzag=sp_split == "zigzag",
        global_batch=global_batch,
        schedule=schedule,
        virtual_stages=virtual_stages,
        stage_layers=parse_stage_layers(stage_layers),
        pipeline_layout=pipeline_layout,
        first_stage_layers=first_stage_layers,
        last_stage_layers=last_stage_layers,
        account_for_embedding=account_for_embedding,
        account_for_loss=account_for_loss,
        stack=stack,
        precision=precision,
        fp8_param_gather=fp8_param_gather,
        fp8_recipe=fp8_recipe,
        cp_comm_type=cp_comm_type,
        **(moe or {}),
    )


def moe_options(dispatcher: str, capacity: float, pad: bool, imbalance: float, node_limit: bool, overlap: bool) -> dict:
    """The mixture-of-experts options as CostOptions takes them (the same flags in memory, predict and
    recommend)."""
    return {
        "moe_dispatcher": dispatcher,
        "capacity_factor": capacity,
        "moe_pad_to_capacity": pad,
        "moe_imbalance": imbalance,
        "deepep_node_limit": node_limit,
        "moe_a2a_overlap": overlap,
    }


def assumed(opts) -> dict:
    """The stack and the knobs a number was computed under, as every output names them."""
    return {
        "stack": opts.stack,
        "stack_version": opts.stack_spec.version,
        "attention_kernel": opts.stack_spec.attention_kernel,
        "grad_dtype": opts.grad_dtype,
        "tp_sequence_parallel": opts.tp_sequence_parallel,
        "flash_attention": opts.flash_attention,
        "recompute": opts.recompute,
        "recompute_modules": list(opts.recompute_modules) if opts.recompute == "selective" else [],
        "act_dtype": opts.act_dtype,
        "optimizer": opts.optimizer,
        "int8_allreduce": opts.int8_allreduce,
        "moe_dispatcher": opts.moe_dispatcher,
        "capacity_factor": opts.capacity_factor,
        "moe_pad_to_capacity": opts.moe_pad_to_capacity,
        "moe_imbalance": opts.moe_imbalance,
        "deepep_node_limit": opts.deepep_node_limit,
        "moe_a2a_overlap": opts.moe_a2a_overlap,
        "precision": opts.precision,
        "fp8_param_gather": opts.fp8_param_gather,
        "fp8_recipe": opts.fp8_recipe,
    }


def fmt_assumed(opts, *, searched: frozenset = frozenset()) -> str:
    """One line: 'stack megatron: grads fp32, Megatron-SP on, flash attention, recompute none, …'; a knob
    the planner searches per mesh is said to be searched instead."""
    sp = "searched" if "tp_sequence_parallel" in searched else ("on" if opts.tp_sequence_parallel else "off")
    rc = "searched" if "recompute" in searched else opts.recompute
    if rc == "selective" and opts.recompute_modules != ("core_attn",):
        rc = f"selective ({', '.join(opts.recompute_modules)})"
    parts = [
        f"grads {opts.grad_dtype}",
        f"Megatron-SP {sp}",
        "flash attention" if opts.flash_attention else "attention as batched GEMMs",
        f"recompute {rc}",
        f"activations {opts.act_dtype}",
    ]
    if opts.int8_allreduce:
        parts.append("int8 all-reduce")
    if opts.precision != "bf16":
        gather = (", weights gathered in FP8" if opts.fp8_param_gather else "") + (
            ", current scaling" if opts.fp8_recipe == "current" else ""
        )
        parts.append(f"linear GEMMs in {opts.precision} (attention core, router, head in bf16){gather}")
    return (
        f"stack {opts.stack} ({opts.stack_spec.version}; attention: {opts.stack_spec.attention_kernel}): "
        + ", ".join(parts)
    )


def fmt_moe(opts) -> str:
    """One line of the mixture-of-experts options a number was computed under."""
    routing = (
        f"token drop at capacity {opts.capacity_factor:g}" + (" (padded)" if opts.moe_pad_to_capacity else "")
        if opts.capacity_factor
        else f"dropless, busiest expert rank at {opts.moe_imbalance:g}× the even share"
    )
    parts = [f"dispatcher {opts.moe_dispatcher}" + (" (node-limited)" if opts.deepep_node_limit else ""), routing]
    if opts.moe_a2a_overlap:
        parts.append("all-to-all overlapped with another micro-batch (1F1B)")
    return "experts: " + ", ".join(parts)


def parse_stage_layers(text: str) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise MeshplanError(f"--stage-layers: {text!r} is not a comma list of layer counts, e.g. 7,8,8,7") from None


@app.command()
@user_errors
def recommend(
    model: str = typer.Option(..., "--model", help="Preset name or path to a HuggingFace config.json."),
    cluster: str = typer.Option(..., "--cluster", help="Preset or TOML path."),
    seq: str = typer.Option("4096", "--seq"),
    batch: Optional[int] = typer.Option(
        None,
        "--batch",
        "--micro-batch",
        help="Sequences a micro-batch on a replica (default 1; searched with --global-batch).",
    ),
    global_batch: int = typer.Option(
        0,
        "--global-batch",
        help="Sequences per optimizer step over the cluster: "
        "fixed, DP changes the accumulation steps, not "
        "the batch (0: one micro-batch per replica).",
    ),
    mode: str = typer.Option("train", "--mode", help="train | prefill | decode"),
    nodes: Optional[int] = typer.Option(None, "--nodes"),
    top: int = typer.Option(10, "--top", help="How many ranked meshes to show."),
    objective: str = typer.Option("throughput", "--objective", help="throughput | memory | latency"),
    stack: str = typer.Option("megatron", "--stack", help=STACK_HELP),
    recompute: Optional[str] = typer.Option(None, "--recompute", help="none | selective | full (default: searched)."),
    flash: Optional[bool] = typer.Option(None, "--flash/--no-flash"),
    grad_dtype: Optional[str] = typer.Option(None, "--grad-dtype"),
    tp_sequence_parallel: Optional[bool] = typer.Option(
        None, "--tp-sequence-parallel/--no-tp-sequence-parallel", help="Megatron-SP on the TP axis (default: searched)."
    ),
    virtual_stages: Optional[int] = typer.Option(
        None, "--virtual-stages", help="Interleaved chunks a pipeline rank (default: searched)."
    ),
    fixed: str = typer.Option(
        "",
        "--fixed",
        help="Knobs not to search, at their defaults: a comma list of "
        "recompute, tp-sequence-parallel, micro-batch, virtual-stages.",
    ),
    int8_allreduce: bool = typer.Option(
        False, "--int8-allreduce/--no-int8-allreduce", help="TP-SSM: int8-quantized block all-reduce."
    ),
    microbatches: int = typer.Option(
        0, "--microbatches", help="Micro-batches a step without --global-batch (0: 4·pp under a pipeline)."
    ),
    launch_floor: bool = typer.Option(
        True,
        "--launch-floor/--no-launch-floor",
        help="--stack meshplan: floor each step at the eager executor's kernel "
        "launches (host time per kernel, measured).",
    ),
    sp_split: str = typer.Option(
        "zigzag",
        "--sp-split",
        help="How SP deals the tokens of attention-only stacks: zigzag (every rank the "
        "same causal work, as meshplan's executor) | contiguous (the last rank's "
        "attention sets the pace).",
    ),
    moe_dispatcher: str = MOE_DISPATCHER,
    capacity_factor: float = CAPACITY_FACTOR,
    moe_pad_to_capacity: bool = MOE_PAD,
    moe_imbalance: float = MOE_IMBALANCE,
    deepep_node_limit: bool = DEEPEP_NODE_LIMIT,
    moe_a2a_overlap: bool = MOE_A2A_OVERLAP,
    precision: str = PRECISION,
    cp_comm_type: str = CP_COMM_TYPE,
    fp8_param_gather: bool = FP8_PARAM_GATHER,
    fp8_recipe: str = FP8_RECIPE,
    etp: str = typer.Option(
        "tp",
        "--etp",
        help="The experts' tensor splits searched: tp (as TP, or whole) | all (any that divides a stage's ranks; "
        "more meshes, slower).",
    ),
    headroom: float = typer.Option(
        0.0,
        "--headroom",
        help="GiB each GPU must keep free beyond what is priced (the allocator's slack, other buffers): "
        "plans that leave less are not ranked.",
    ),
    show_all: bool = typer.Option(False, "--all", help="With --json: every valid mesh, fitting or not."),
    as_json: bool = typer.Option(False, "--json"),
):
    """Rank every mesh of the cluster for a model and shape — with recompute, Megatron-SP, micro-batch and
    virtual stages chosen per mesh — and say why the winner wins."""
    from meshplan.costmodel.device import Device
    from meshplan.hf_config import load_model
    from meshplan.layout import validate_int8_allreduce
    from meshplan.planner import plan
    from meshplan.predict import uncalibrated_note, uncalibrated_sizes
    from meshplan.reports import parse_tokens
    from meshplan.topologies.cluster import load_cluster

    _at_least("--top", top, 1)
    if batch is not None:
        _at_least("--batch", batch, 1)
    if virtual_stages is not None:
        _at_least("--virtual-stages", virtual_stages, 1)
    spec = load_model(model)
    cluster_spec = load_cluster(cluster, nodes)
    tokens = parse_tokens(seq)
    if int8_allreduce:
        validate_int8_allreduce(None, spec)  # the planner's TP-SSM meshes use it
        if tp_sequence_parallel is None:
            tp_sequence_parallel = False  # it quantizes the all-reduce Megatron-SP would replace
    pinned = {name.strip().replace("-", "_") for name in fixed.split(",") if name.strip()}
    given = {
        "recompute": recompute is not None,
        "tp_sequence_parallel": tp_sequence_parallel is not None,
        "micro_batch": batch is not None or not global_batch,
        "virtual_stages": virtual_stages is not None,
    }
    if unknown := pinned - set(given):
        raise MeshplanError(
            f"--fixed: unknown knob {sorted(unknown)[0]!r}; use recompute, tp-sequence-parallel, "
            "micro-batch, virtual-stages"
        )
    search = frozenset(k for k, g in given.items() if not g and k not in pinned)
    opts = stack_options(
        stack,
        mode=mode,
        recompute=recompute or "none",
        flash=flash,
        grad_dtype=grad_dtype,
        tp_sequence_parallel=bool(tp_sequence_parallel),
        int8_allreduce=int8_allreduce,
        global_batch=global_batch,
        microbatches=microbatches,
        virtual_stages=virtual_stages or 1,
        launch_floor=launch_floor,
        sp_split=sp_split,
        moe=moe_options(
            moe_dispatcher, capacity_factor, moe_pad_to_capacity, moe_imbalance, deepep_node_limit, moe_a2a_overlap
        ),
        precision=precision,
        fp8_param_gather=fp8_param_gather,
        fp8_recipe=fp8_recipe,
        cp_comm_type=cp_comm_type,
    )
    micro = batch or 1
    result = plan(
        spec,
        cluster_spec,
        tokens,
        micro,
        opts,
        objective=objective,
        estimate_dropped=show_all,
        search=search,
        etp=etp,
        keep=max(top, 2),
        headroom_bytes=headroom * 2**30,
    )
    rates_note = Device.of(cluster_spec, opts.stack_spec).rates_note
    if as_json:
        rows = result.ranked + (result.dropped if show_all else [])
        # The stack's assumptions beside each mesh's own knobs (recompute and Megatron-SP among them).
        common = {k: v for k, v in assumed(opts).items() if k not in ("recompute", "tp_sequence_parallel")}
        common["rates_note"] = rates_note
        common["headroom_gib"] = headroom  # what a ranked plan leaves free beyond what is priced ("fits" counts it)
        _print_json([{**c.as_dict(), "assumptions": common} for c in (rows if show_all else rows[:top])])
        if not result.ranked:
            raise typer.Exit(NOTHING_FITS_EXIT)
        return
    what = {"train": "step", "prefill": "TTFT", "decode": "TPOT"}[mode]
    shape = f"global batch {global_batch}" if global_batch else f"micro-batch {micro} a replica"
    table = Table(
        title=f"{spec.name} on {cluster_spec.name} · {mode} · seq {fmt_tokens(tokens)} · {shape} "
        f"· stack {stack} · by {objective}"
    )
    for col in ("#", "layout", "knobs", "mem/GPU", what, "tokens/s", "exposed comm", "comm/step", "MFU", "regime"):
        table.add_column(col, justify="right" if col not in ("layout", "regime", "knobs") else "left")
    for i, c in enumerate(result.ranked[:top], 1):
        e = c.estimate
        name = f"{c.layout}{'*' if c.not_executed else ''}"
        table.add_row(
            str(i),
            name,
            _fmt_knobs(c.knobs, c.layout),
            fmt_bytes(c.device_bytes),
            _fmt_s(e.step_time_s),
            f"{e.tokens_per_s:,.0f}",
            _fmt_s(e.exposed_comm_s),
            fmt_bytes(e.comm_bytes_per_step),
            f"{e.mfu:.0%}",
            c.regime,
        )
    caption = [f"knobs: {', '.join(sorted(search)) or 'none'} searched per mesh"]
    if any(c.not_executed for c in result.ranked[:top]):
        caption.append("* priced by the cost model; meshplan execute does not run it")
    table.caption = "; ".join(caption)
    if not result.ranked:  # the reason alone, which names the smallest mesh and what it needs
        console.print(result.reason, highlight=False)
        console.print(f"assumed: {fmt_assumed(opts, searched=search)}", highlight=False)
        raise typer.Exit(NOTHING_FITS_EXIT)
    console.print(table)
    console.print(result.reason, highlight=False)
    console.print(f"assumed: {fmt_assumed(opts, searched=search)}", highlight=False)
    if spec.moe is not None:
        console.print(fmt_moe(opts), highlight=False)
    if rates_note:
        console.print(f"note: {rates_note}", highlight=False)
    if note := uncalibrated_note(uncalibrated_sizes(spec, cluster_spec, result.ranked[0].layout, tokens, micro, opts)):
        console.print(f"note: the winner: {note}", highlight=False)
    console.print(RECOMMEND_LEGEND.format(what=WHAT_LEGEND[what]), highlight=False)


# `recommend`'s exit status when no mesh fits the GPUs' memory (2 is a bad input, 1 a failed compare).
NOTHING_FITS_EXIT = 3

RECOMMEND_LEGEND = (
    "legend: knobs chosen per mesh — rc = activation recompute (none | selective: attention's core | full: "
    "whole layers), mbs = micro-batch size in sequences, tp-sp = Megatron sequence parallelism on the TP "
    "axis (norms and dropouts split by sequence), v = interleaved virtual pipeline stages a rank; "
    "* = not runnable by meshplan execute. mem/GPU = predicted peak memory a GPU, the CUDA context and "
    "NCCL's buffers beside the allocator included; {what}; exposed comm = transfer time not hidden "
    "behind compute; comm/step = bytes a GPU sends a step; MFU = model FLOPs over the GPUs' bf16 peak; "
    "regime = the tokens a micro-batch puts through a layer (b·s) against the "
    "b·s above which TSP moves fewer bytes than TP at the mesh's tensor degree, in units of the hidden "
    "size h (`meshplan crossover` explains it); `no weight split` = no tensor axis."
)
WHAT_LEGEND = {
    "step": "step = time of one training step (all its micro-batches)",
    "TTFT": "TTFT = time to first token (the prefill of one batch)",
    "TPOT": "TPOT = time per output token (one decode step)",
}


def _fmt_knobs(knobs: dict, layout) -> str:
    parts = [f"rc={knobs['recompute']}", f"mbs={knobs['micro_batch']}"]
    if layout.tensor_degree > 1 and knobs["tp_sequence_parallel"]:
        parts.append("tp-sp")
    if knobs["virtual_stages"] > 1:
        parts.append(f"v={knobs['virtual_stages']}")
    return " ".join(parts)


def _fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} µs"


@app.command()
@user_errors
def predict(
    model: str = typer.Option(..., "--model", help="Preset name or path to a HuggingFace config.json."),
    cluster: str = typer.Option(..., "--cluster", help="Preset or TOML path."),
    layout: str = typer.Option(..., "--layout", help="e.g. dp=16,pp=8,tp=8,zero=1"),
    seq: str = typer.Option(..., "--seq"),
    nodes: Optional[int] = typer.Option(None, "--nodes"),
    global_batch: int = typer.Option(
        0,
        "--global-batch",
        help="Sequences per optimizer step over the cluster (0: one micro-batch per replica, or --microbatches).",
    ),
    micro_batch: int = typer.Option(1, "--micro-batch", help="Sequences per micro-batch on a replica."),
    microbatches: int = typer.Option(0, "--microbatches", help="Micro-batches a step without --global-batch."),
    schedule: str = typer.Option("1f1b", "--schedule", help="1f1b | interleaved"),
    virtual_stages: int = typer.Option(1, "--virtual-stages", help="Model chunks a pipeline rank holds (interleaved)."),
    stage_layers: str = typer.Option("", "--stage-layers", help="Layers of each stage, e.g. 7,8,8,7 (default: even)."),
    pipeline_layout: str = typer.Option(
        "",
        "--pipeline-layout",
        help="Megatron-Core's --pipeline-model-parallel-layout: E embedding, t decoder layer, m MTP layer, L loss, "
        "| between the pp × virtual stages (stage k: chunk k // pp of rank k % pp), e.g. Et*3|(tt|)*29,m|L.",
    ),
    first_stage_layers: int = typer.Option(
        0,
        "--first-stage-layers",
        help="Decoder layers of the first stage, the rest split evenly (Megatron's "
        "--decoder-first-pipeline-num-layers).",
    ),
    last_stage_layers: int = typer.Option(
        0, "--last-stage-layers", help="Decoder layers of the last stage (--decoder-last-pipeline-num-layers)."
    ),
    account_for_embedding: bool = typer.Option(
        False, "--account-for-embedding", help="Count the embedding as a layer of the first chunk in the split."
    ),
    account_for_loss: bool = typer.Option(
        False, "--account-for-loss", help="Count the loss as a layer of the last chunk in the split."
    ),
    recompute: str = typer.Option("none", "--recompute", help="none | selective | full"),
    recompute_modules: str = RECOMPUTE_MODULES,
    tp_sequence_parallel: Optional[bool] = typer.Option(
        None,
        "--tp-sequence-parallel/--no-tp-sequence-parallel",
        help="Megatron-SP on the TP axis (default: the stack's; on under megatron).",
    ),
    stack: str = typer.Option("megatron", "--stack", help=STACK_HELP),
    mode: str = typer.Option("train", "--mode", help="train | prefill | decode"),
    flash: Optional[bool] = typer.Option(None, "--flash/--no-flash", help="Default: as the stack runs attention."),
    grad_dtype: Optional[str] = typer.Option(None, "--grad-dtype", help="Default: the stack's (fp32 under Megatron)."),
    moe_dispatcher: str = MOE_DISPATCHER,
    capacity_factor: float = CAPACITY_FACTOR,
    moe_pad_to_capacity: bool = MOE_PAD,
    moe_imbalance: float = MOE_IMBALANCE,
    deepep_node_limit: bool = DEEPEP_NODE_LIMIT,
    moe_a2a_overlap: bool = MOE_A2A_OVERLAP,
    precision: str = PRECISION,
    cp_comm_type: str = CP_COMM_TYPE,
    fp8_param_gather: bool = FP8_PARAM_GATHER,
    fp8_recipe: str = FP8_RECIPE,
    as_json: bool = typer.Option(False, "--json"),
):
    """Cost of one given plan — memory, step time, throughput, MFU/HFU, exposed communication, the
    pipeline bubble — with no search."""
    from meshplan.hf_config import load_model
    from meshplan.layout import parse_layout
    from meshplan.predict import predict as predict_plan
    from meshplan.predict import uncalibrated_note
    from meshplan.reports import parse_tokens
    from meshplan.topologies.cluster import load_cluster

    _at_least("--micro-batch", micro_batch, 1)
    opts = stack_options(
        stack,
        mode=mode,
        recompute=recompute,
        recompute_modules=recompute_modules,
        flash=flash,
        grad_dtype=grad_dtype,
        tp_sequence_parallel=tp_sequence_parallel,
        global_batch=global_batch,
        microbatches=microbatches,
        schedule=schedule,
        virtual_stages=virtual_stages,
        stage_layers=stage_layers,
        pipeline_layout=pipeline_layout,
        first_stage_layers=first_stage_layers,
        last_stage_layers=last_stage_layers,
        account_for_embedding=account_for_embedding,
        account_for_loss=account_for_loss,
        moe=moe_options(
            moe_dispatcher, capacity_factor, moe_pad_to_capacity, moe_imbalance, deepep_node_limit, moe_a2a_overlap
        ),
        precision=precision,
        fp8_param_gather=fp8_param_gather,
        fp8_recipe=fp8_recipe,
        cp_comm_type=cp_comm_type,
    )
    result = predict_plan(
        load_model(model), load_cluster(cluster, nodes), parse_layout(layout), parse_tokens(seq), micro_batch, opts
    )
    out = result.as_dict()
    out["assumptions"] = assumed(opts)
    out["mfu_peak"] = "bf16"  # Megatron's convention: MFU over the bf16 peak, whatever the GEMMs' precision
    if opts.precision != "bf16":
        gpu = result.cluster.gpu
        out["mfu_fp8_peak"] = out["mfu"] * gpu.bf16_flops_per_s / gpu.fp8_flops_per_s
    if as_json:
        _print_json(out)
        return
    table = Table(
        title=f"{out['model']} on {out['cluster']} ({out['gpus']:,} GPUs) · {out['layout']} · {mode} · "
        f"seq {fmt_tokens(out['seq'])} · stack {stack}"
    )
    table.add_column("quantity")
    table.add_column("value", justify="right")
    rows = [
        (
            "global batch / micro-batch / micro-batches",
            f"{out['global_batch']} / {micro_batch} / {out['microbatches']}",
        ),
        (
            "pipeline",
            f"{out['schedule']}, {out['virtual_stages']} chunk(s) a rank, stages {_fmt_stages(out['stage_layers'])}"
            + (f"; chunks {_fmt_chunks(out['chunk_layers'])}" if out["chunk_layers"] else "")
            if out["schedule"]
            else "none",
        ),
        (
            "memory per GPU",
            f"{fmt_bytes(out['total_bytes'])} + {fmt_bytes(out['outside_allocator_bytes'])} beside of "
            f"{fmt_bytes(out['gpu_memory_bytes'])} "
            f"({'fits' if out['fits'] else 'does NOT fit'}; peak: {out['pipeline_stage']} stage, {out['peak_phase']})",
        ),
        (
            "  beside the allocator",
            f"CUDA context {fmt_bytes(out['outside_allocator']['cuda_context'])}, NCCL "
            f"{fmt_bytes(out['outside_allocator']['nccl_communicators'])} "
            f"({len(out['outside_allocator']['communicators'])} communicators)",
        ),
        ("step time", _fmt_s(out["step_time_s"])),
        (
            "  = compute + bubble + exposed comm + optimizer + launch wait",
            " + ".join(
                _fmt_s(out[k]) for k in ("compute_s", "bubble_s", "exposed_comm_s", "optimizer_s", "launch_wait_s")
            ),
        ),
        ("tokens/s", f"{out['tokens_per_s']:,.0f}"),
        ("MFU / HFU (of the bf16 peak)", f"{out['mfu']:.1%} / {out['hfu']:.1%}"),
        *([("MFU of the FP8 peak", f"{out['mfu_fp8_peak']:.1%}")] if "mfu_fp8_peak" in out else []),
        ("model TFLOP/s per GPU", f"{out['tflops_per_gpu']:.1f}"),
        ("exposed communication", _fmt_s(out["exposed_comm_s"])),
        *(
            [("  of which", ", ".join(f"{k.replace('_', ' ')} {_fmt_s(v)}" for k, v in out["exposed_by"].items()))]
            if out["exposed_by"]
            else []
        ),
        (
            "pipeline bubble",
            f"{out['bubble_fraction']:.1%} of the passes"
            + (" (schedule simulated: uneven stages or chunks)" if out["pipeline_simulated"] else ""),
        ),
        ("bound", out["bound"]),
    ]
    for label, value in rows:
        table.add_row(label, value)
    console.print(table)
    parts = ", ".join(f"{COMPONENT_LABELS[k]} {v / 2**30:.2f}" for k, v in out["memory_bytes"].items() if v)
    console.print(f"memory (GiB): {parts}", highlight=False)
    console.print(f"assumed: {fmt_assumed(opts)}", highlight=False)
    if result.model.moe is not None:
        console.print(fmt_moe(opts), highlight=False)
    if out["rates_note"]:
        console.print(f"note: {out['rates_note']}", highlight=False)
    if note := uncalibrated_note(out["uncalibrated_group_sizes"]):
        console.print(f"note: {note}", highlight=False)
    console.print(memory_legend([k for k, v in out["memory_bytes"].items() if v]), highlight=False)
    console.print(PREDICT_LEGEND, highlight=False)


PREDICT_LEGEND = (
    "MFU = model FLOPs a second over the GPUs' bf16 peak; HFU counts recomputed FLOPs too; exposed "
    "communication = transfer time not hidden behind compute; pipeline bubble = the share of a step pipeline "
    "stages sit idle; bound = what limits the step (compute, exposed communication, HBM reads, collective latency "
    "or the host's kernel launches)"
)


def _fmt_chunks(rows: list[list[int]]) -> str:
    """Each rank's chunks' layers, runs of equal ranks and of equal chunks folded: 'rank 0 [1, 2×7],
    ranks 1–6 [2×8], rank 7 [2×7, 1]'."""

    def row_text(row: list[int]) -> str:
        runs = [(n, len(list(g))) for n, g in itertools.groupby(row)]
        return "[" + ", ".join(f"{n}×{k}" if k > 1 else str(n) for n, k in runs) + "]"

    parts, start = [], 0
    for row, group in itertools.groupby(rows):
        k = len(list(group))
        ranks = f"rank {start}" if k == 1 else f"ranks {start}–{start + k - 1}"
        parts.append(f"{ranks} {row_text(row)}")
        start += k
    return ", ".join(parts)


def _fmt_stages(stages: list[int]) -> str:
    if len(set(stages)) == 1:
        return f"{len(stages)} × {stages[0]} layers"
    return "[" + ", ".join(map(str, stages)) + "] layers"


@app.command()
@user_errors
def crossover(
    model: str = typer.Option(..., "--model"),
    degree: int = typer.Option(..., "--degree", help="D for TSP, T for TP."),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="Also find where time crosses over."),
    nodes: Optional[int] = typer.Option(None, "--nodes"),
    stack: str = typer.Option("megatron", "--stack", help=STACK_HELP + " (the time crossover's)"),
    as_json: bool = typer.Option(False, "--json"),
):
    """The b·s above which TSP moves fewer bytes per layer than TP (and, on a cluster, is faster)."""
    import math

    from meshplan.costmodel.crossover import time_crossover_limit, time_crossover_tokens, volume_crossover_tokens
    from meshplan.hf_config import load_model
    from meshplan.layout import Layout, validate_layout
    from meshplan.topologies.cluster import load_cluster

    spec = load_model(model)
    if degree < 2:
        raise MeshplanError(f"--degree must be >= 2, got {degree}")
    validate_layout(Layout(tsp=degree), spec)
    cl = load_cluster(cluster, nodes) if cluster else None
    if cl is not None and (degree > cl.num_gpus or cl.num_gpus % degree):
        raise MeshplanError(
            f"--degree {degree}: {cl.name} has {cl.num_gpus} GPUs, and a TP or TSP group of {degree} must divide "
            f"them; pick a degree that divides {cl.num_gpus}, or add nodes (--nodes)"
        )
    opts = stack_options(stack)
    fwd = volume_crossover_tokens(spec, degree)
    train = volume_crossover_tokens(spec, degree, phases=("fwd", "bwd"))
    out = {
        "model": spec.name,
        "degree": degree,
        "volume_crossover_tokens": None if math.isinf(fwd) else fwd,
        "volume_crossover_tokens_train": None if math.isinf(train) else train,
        "volume_crossover_over_h": None if math.isinf(fwd) else fwd / spec.d_model,
    }
    if cl is not None:
        t = time_crossover_tokens(spec, degree, cl, opts)
        out["cluster"] = cl.name
        out["time_crossover_tokens"] = None if math.isinf(t) else t
        out["assumptions"] = assumed(opts)
    if as_json:
        _print_json(out)
        return

    def show(x):
        return "never" if x is None else f"b·s = {x:,.0f} ({x / spec.d_model:.2f}h)"

    console.print(
        f"{spec.name}, degree {degree}: TSP moves fewer bytes than TP per layer above "
        f"{show(out['volume_crossover_tokens'])} in the forward pass, above "
        f"{show(out['volume_crossover_tokens_train'])} for forward + backward.",
        highlight=False,
    )
    if cl is not None:
        t = out["time_crossover_tokens"]
        when = (
            f"is slower than TP's at every length up to {time_crossover_limit(degree):,} tokens a sequence"
            if t is None
            else f"is no slower than TP's from {t:,.0f} tokens a sequence ({t / spec.d_model:.2f}h) on"
        )
        console.print(
            f"On {out['cluster']}, a TSP training step (batch 1) {when}; assumed: {fmt_assumed(opts)}.",
            highlight=False,
        )
    console.print(
        "(b·s = tokens a micro-batch puts through a layer; h = the hidden size. TP all-reduces activations, "
        "b·s·h per layer; TSP streams weight shards, a fixed cost, and gathers K/V, so it moves less above "
        "the crossover.)",
        highlight=False,
    )


# -- execute and compare --------------------------------------------------------------------------


@app.command()
@user_errors
def execute(
    model: str = typer.Option(..., "--model"),
    layout: str = typer.Option(..., "--layout"),
    seq: str = typer.Option(..., "--seq"),
    batch: int = typer.Option(1, "--batch"),
    nproc: int = typer.Option(..., "--nproc", help="Processes on this node (GPUs, or CPU processes with gloo)."),
    mode: str = typer.Option("train", "--mode", help="train | prefill | decode (one token after a prefill of --seq)"),
    device: str = typer.Option("cpu", "--device", help="cpu (gloo) | cuda (NCCL)"),
    steps: int = typer.Option(5, "--steps"),
    layers: int = typer.Option(0, "--layers", help="Run only this many layers of the model (0: all)."),
    out: str = typer.Option("run.json", "--out"),
    do_compare: bool = typer.Option(False, "--compare", help="Compare with the prediction right after."),
    do_profile: bool = typer.Option(False, "--profile", help="GPU time by kernel category (one extra step)."),
    int8_allreduce: bool = typer.Option(
        False, "--int8-allreduce/--no-int8-allreduce", help="TP-SSM: int8-quantized block all-reduce."
    ),
    tolerance: float = typer.Option(0.05, "--tolerance"),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds before a hung run is stopped."),
    cuda_graph: Optional[bool] = typer.Option(
        None,
        "--cuda-graph/--no-cuda-graph",
        help="Replay the training step as a CUDA graph (no pp, ZeRO, experts, int8 all-reduce or Zamba2; TSP and "
        "collectives over several axes with NCCL_GRAPH_REGISTER=0, which execute sets); by default wherever it can "
        "be, and the run file says whether it was.",
    ),
    layers_only: bool = typer.Option(
        False,
        "--layers-only",
        help="Run the layer stack on random hidden states: "
        "no embedding, LM head or loss (how docs/validation.md's 1-4 GPU runs were made).",
    ),
    tokens_file: Optional[str] = typer.Option(
        None,
        "--tokens",
        help=".npy of token ids to train on (the whole "
        "model; synthetic ids by default), or a .npz of `tokens` and "
        "`documents` (packed documents, kept apart in Mamba-2 blocks).",
    ),
    weights: Optional[str] = typer.Option(
        None,
        "--weights",
        help="A local HF safetensors checkpoint folder (llama, "
        "mistral, phi3, mamba2): each rank reads its shard; the run records the "
        "first batch's loss. Random weights by default.",
    ),
    cluster: str = typer.Option(
        "",
        "--cluster",
        help="Preset or calibrated profile (meshplan calibrate) the time prediction assumes "
        "(default: the preset of the GPU the run is on, at its datasheet rates).",
    ),
    nnodes: int = typer.Option(1, "--nnodes"),
    node_rank: int = typer.Option(0, "--node-rank"),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint"),
):
    """Run a layout for real under torchrun and record what it costs (one JSON file)."""
    from meshplan.hf_config import load_model
    from meshplan.layout import parse_layout, validate_int8_allreduce, validate_layout, validate_seq
    from meshplan.reports import parse_tokens

    for flag, value, low in (
        ("--nproc", nproc, 1),
        ("--nnodes", nnodes, 1),
        ("--steps", steps, 1),
        ("--layers", layers, 0),
        ("--batch", batch, 1),
    ):
        _at_least(flag, value, low)
    spec = load_model(model)
    lay = parse_layout(layout)
    tokens = parse_tokens(seq)
    if mode not in ("train", "prefill", "decode"):
        raise MeshplanError(f"--mode: use train, prefill or decode, not {mode!r}")
    if device not in ("cpu", "cuda"):
        raise MeshplanError(f"--device: use cpu or cuda, not {device!r}")
    _positive_seconds("--timeout", timeout)
    _at_least_float("--tolerance", tolerance, 0.0)
    validate_layout(lay, spec, nproc * nnodes)
    validate_seq(lay, tokens, batch)
    if int8_allreduce:
        validate_int8_allreduce([lay], spec)
    from meshplan.executor.support import unsupported

    # What the model is (a hybrid, say) is refused before what --layers would cut it to.
    if (reason := unsupported(lay, spec, not layers_only)) is not None:
        raise MeshplanError(reason)
    if layers:
        from meshplan.models import first_layers

        spec = first_layers(spec, layers)  # what the workers build
        if (reason := unsupported(lay, spec, not layers_only)) is not None:
            raise MeshplanError(reason)
    from meshplan.executor.support import executed_spec

    spec, dropped = executed_spec(spec)
    if dropped:
        err_console.print(
            f"note: the executor runs {spec.name} without {', '.join(dropped)}; the prediction it "
            f"is compared with leaves them out too"
        )
    _check_folder("--out", out)
    if cluster:
        from meshplan.topologies import load_cluster

        if device != "cuda":
            raise MeshplanError("--cluster: times are predicted for GPU runs only; drop it with --device cpu")
        load_cluster(cluster)  # a typo or a bad profile stops here, in one line, not in the workers
    if weights:
        _check_weights(weights, model, spec, dropped, layers, layers_only)
    if tokens_file:
        if layers_only:
            raise MeshplanError(
                "--tokens: the layer stack runs on hidden states; drop --layers-only to train on tokens"
            )
        from meshplan.executor.model import tokens_from_file

        # A bad file stops here, not in every rank.
        if tokens_from_file(tokens_file, spec.vocab, batch, tokens)[2] is not None and spec.family != "mamba2":
            raise MeshplanError(
                f"--tokens: {tokens_file} packs documents, which the executor keeps apart in Mamba-2 "
                f"blocks only ({spec.name}'s attention would see across them); give a .npy of ids"
            )
    if cuda_graph:
        from meshplan.executor.graphs import limits as graph_limits
        from meshplan.executor.graphs import worker_env

        if (reason := graph_limits(lay, spec, mode, device, int8_allreduce, env=worker_env(lay))) is not None:
            raise MeshplanError(f"--cuda-graph: this step is not captured ({reason}); drop --cuda-graph")
    if device == "cuda":
        _check_gpus("--device", nproc)
        _warn_if_over_gpu_memory(spec, lay, tokens, batch, mode, not layers_only)
    from meshplan.executor.runspec import RunSpec, spec_file
    from meshplan.executor.torchrun import WorkersFailed, failed_run, worker_command

    record = RunSpec(
        model=model,
        layout=layout,
        seq=tokens,
        out=out,
        batch=batch,
        mode=mode,
        device=device,
        steps=steps,
        timeout=timeout,
        layers=layers,
        layers_only=layers_only,
        tokens=tokens_file,
        weights=weights,
        profile=do_profile,
        int8_allreduce=int8_allreduce,
        cuda_graph=cuda_graph,
        cluster=cluster,
    )
    try:
        with spec_file(record) as path:
            cmd = worker_command("meshplan.executor.worker", path, nproc, nnodes, node_rank, rdzv_endpoint)
            run_with_progress(cmd, timeout, f"{lay} on {nproc * nnodes} {device} processes")
    except WorkersFailed as exc:
        failed = failed_run(
            exc,
            model=spec.name,
            layout=str(lay),
            seq=tokens,
            batch=batch,
            mode=mode,
            device=device,
            world=nproc * nnodes,
            layers=spec.layers,
            steps=steps,
        )
        if node_rank == 0:
            with open(out, "w") as f:
                json.dump(failed, f, indent=1)
            raise MeshplanError(f"{exc}; wrote {out} with status failed and the steps that finished") from None
        raise
    if not do_compare:
        console.print(run_summary(read_json(out)))
    console.print(f"wrote {out}" + ("" if do_compare else f"; `meshplan compare {out}` sets it against the prediction"))
    if do_compare:
        _compare_file(out, tolerance, False)


def run_with_progress(cmd: list[str], timeout: float, label: str) -> list[dict]:
    """Run torchrun's workers under a progress bar of their finished steps (on stderr, gone when done);
    returns the progress records. A failure is executor.torchrun.WorkersFailed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from meshplan.executor.torchrun import run_workers

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn(f"(stopped at {timeout:g} s)"),
        console=err_console,
        transient=True,
    ) as progress:
        task = progress.add_task(f"{label}: starting", total=None)

        def show(record: dict) -> None:
            progress.update(
                task, total=record["total"], completed=record["done"], description=f"{label}: {record['what']}"
            )

        return run_workers(cmd, timeout, show)


def _check_weights(folder: str, model: str, spec, dropped: list, layers: int, layers_only: bool) -> None:
    """A checkpoint the workers can load into `spec`, or one line saying why not."""
    from dataclasses import replace

    from meshplan.executor.checkpoint import Checkpoint
    from meshplan.hf_config import load_model

    if layers_only or layers:
        raise MeshplanError("--weights: a checkpoint runs as the whole model; drop --layers-only and --layers")
    if dropped:
        raise MeshplanError(
            f"--weights: the executor would run this checkpoint without {', '.join(dropped)}, so its "
            f"loss would not be the model's; run it without --weights"
        )
    Checkpoint(folder)  # config and files readable, model_type and settings the executor runs
    own = load_model(folder)
    if replace(own, name="", source="") != replace(load_model(model), name="", source=""):
        raise MeshplanError(
            f"--weights: {folder}/config.json describes another model than --model {model}; give --model {folder}"
        )


def _warn_if_over_gpu_memory(spec, lay, seq: int, batch: int, mode: str, whole: bool) -> None:
    """A predicted peak above the GPU's memory: a warning before torchrun starts (the run goes on, and
    records its out-of-memory as a result)."""
    import torch

    from meshplan.predict import predict_run

    have = torch.cuda.get_device_properties(0).total_memory
    predicted = predict_run(spec, lay, seq, batch, mode, None, whole=whole)
    need = predicted["peak_bytes"] + predicted["outside_allocator_bytes"]  # with the CUDA context, NCCL's buffers
    if need > have:
        err_console.print(
            f"warning: the predicted peak, {fmt_bytes(need)} a GPU, exceeds this GPU's "
            f"{fmt_bytes(have)}; expect the run to record an out-of-memory"
        )


def run_summary(run: dict) -> str:
    """One line of what a run measured (step time, peak memory a rank, bytes a rank's collectives moved
    a step) beside what the model predicted."""
    m, p = run["measured"], run["predicted"]
    head = f"{run['model']} · {run['layout']} · {run['mode']}: "
    if run.get("oom") or "step_time_s" not in m:
        what = "out of memory" if run.get("oom") else "failed"
        return (
            head
            + f"{what} ({m.get('error', 'no measurement')[:120]}); predicted peak {fmt_bytes(p['peak_bytes'])} a rank"
        )
    parts = [
        f"step {_fmt_s(m['step_time_s'])}"
        + (f" (predicted {_fmt_s(p['step_time_s'])})" if p.get("step_time_s") else "")
    ]
    if m.get("peak_bytes"):
        parts.append(f"peak {fmt_bytes(m['peak_bytes'])} a rank (predicted {fmt_bytes(p['peak_bytes'])})")
    moved, want = sum(m.get("comm_bytes", {}).values()), sum(p.get("comm_bytes", {}).values())
    parts.append(f"{fmt_bytes(moved)} moved a rank a step (predicted {fmt_bytes(want)})")
    if m.get("loss") is not None:
        parts.append(f"first-batch loss {m['loss']:.4f}" + (" (checkpoint weights)" if run.get("weights") else ""))
    return f"{run['model']} · {run['layout']} · {run['mode']}: " + ", ".join(parts)


@app.command()
@user_errors
def compare(
    run_file: str = typer.Argument(..., help="A run file written by meshplan execute."),
    tolerance: float = typer.Option(0.05, "--tolerance"),
    as_json: bool = typer.Option(False, "--json"),
):
    """Predicted against measured for a run; exit 1 beyond the tolerance."""
    _at_least_float("--tolerance", tolerance, 0.0)
    _compare_file(run_file, tolerance, as_json)


def _compare_file(path: str, tolerance: float, as_json: bool) -> None:
    from meshplan.executor.compare import compare_run

    run = read_json(path)
    rows, ok = compare_run(run, tolerance)
    if as_json:
        _print_json(
            {"run": path, "tolerance": tolerance, "ok": ok, "predicted_on": run.get("predicted_on"), "rows": rows}
        )
    else:
        what = {True: " · whole model", False: " · layers only"}.get(run.get("whole_model"), "")
        table = Table(
            title=f"{run['model']} · {run['layout']} · {run['mode']} · seq {run['seq']} · {run['device']}{what}"
        )
        for col in ("quantity", "predicted", "measured", "error", "ok"):
            table.add_column(col, justify="left" if col == "quantity" else "right")
        for r in rows:
            err = "-" if r["relative_error"] is None else f"{r['relative_error']:+.1%}"
            fmt = _fmt_s if r["quantity"] in ("step time", "exposed communication (s)") else fmt_bytes
            table.add_row(
                r["quantity"],
                fmt(r["predicted"]),
                fmt(r["measured"]),
                err,
                "[green]yes[/]" if r["ok"] else "[red]no[/]",
            )
        console.print(table)
        if on := run.get("predicted_on"):
            how = (
                f"calibrated {on['calibrated']}"
                if on.get("calibrated")
                else "a preset: its links at the datasheet rate, which NCCL does not reach "
                "(`meshplan calibrate` measures this machine's and writes a profile for --cluster)"
            )
            console.print(f"times predicted on {on['cluster']}, {how}", highlight=False)
        console.print(
            f"legend: error = (measured − predicted) / predicted; ok = within --tolerance {tolerance:g} "
            "(bytes moved must match exactly); bytes KIND/AXIS = a rank's bytes a step in that collective on "
            "that mesh axis; peak memory and step time are compared on GPU runs only, and beside the allocator "
            "(the CUDA context and NCCL's buffers the driver holds outside PyTorch's, within 10%)",
            highlight=False,
        )
    if not ok:
        raise typer.Exit(1)


@app.command()
@user_errors
def calibrate(
    nproc: int = typer.Option(..., "--nproc", help="Processes (GPUs) on this node."),
    out: str = typer.Option("profile.toml", "--out"),
    cluster: str = typer.Option("h200-8", "--cluster", help="Preset the profile extends."),
    quick: bool = typer.Option(False, "--quick", help="Fewer sizes and repeats (minutes, not tens)."),
    device: str = typer.Option("cuda", "--device", help="cuda (NCCL) | cpu (gloo: collectives only)"),
    max_bytes: int = typer.Option(0, "--max-bytes", help="Largest message (default 1 GiB; 256 MiB with --quick)."),
    timeout: float = typer.Option(1800.0, "--timeout"),
):
    """Measure this machine's GEMM, HBM, attention, host launch cost and collectives; write a profile for --cluster."""
    from meshplan.executor.runspec import CalibrationSpec, spec_file
    from meshplan.executor.torchrun import worker_command
    from meshplan.topologies.cluster import preset_names

    _at_least("--nproc", nproc, 1)
    _positive_seconds("--timeout", timeout)
    if cluster not in preset_names():
        raise MeshplanError(f"--cluster: {cluster!r} is not a preset ({', '.join(preset_names())})")
    if device not in ("cpu", "cuda"):
        raise MeshplanError(f"--device: use cpu or cuda, not {device!r}")
    _check_folder("--out", out)
    if device == "cuda":
        _check_gpus("--device", nproc)
    record = CalibrationSpec(out=out, cluster=cluster, quick=quick, device=device, max_bytes=max_bytes)
    with spec_file(record) as path:
        cmd = worker_command("meshplan.executor.calibrate_run", path, nproc)
        run_with_progress(cmd, timeout, f"calibrating {nproc} {device} processes")
    console.print(f"wrote {out}; use it with --cluster {out}")


def _check_gpus(flag: str, nproc: int) -> None:
    """Enough visible GPUs for `nproc` processes, or one line before anything launches."""
    import torch

    if not torch.cuda.is_available():
        raise MeshplanError(f"{flag}: cuda was asked for but no GPU is visible here; use --device cpu (gloo)")
    if torch.cuda.device_count() < nproc:
        raise MeshplanError(
            f"--nproc {nproc}: only {torch.cuda.device_count()} GPU(s) are visible here; give --nproc "
            f"{torch.cuda.device_count()} or fewer"
        )


# -- listings ------------------------------------------------------------------------------------


@app.command()
@user_errors
def models(as_json: bool = typer.Option(False, "--json")):
    """List the model presets."""
    from meshplan.models import PRESETS

    rows = []
    for name, m in PRESETS.items():
        attn, mlp = m.attention, m.mlp
        rows.append(
            {
                "name": name,
                "family": m.family,
                "params": m.param_count(),
                "d_model": m.d_model,
                "layers": m.layers,
                "heads": attn.heads if attn else None,
                "kv_heads": attn.kv_heads if attn else None,
                "ffn_hidden": mlp.ffn_hidden if mlp else None,
                "mlp_gated": mlp.gated if mlp else None,
                "vocab": m.vocab,
                "source": m.source,
            }
        )
    if as_json:
        _print_json(rows)
        return
    table = Table(title="model presets")
    for col in ("name", "family", "params", "d_model", "layers", "heads/kv", "MLP", "vocab", "source"):
        table.add_column(col)
    for r in rows:
        heads = f"{r['heads']}/{r['kv_heads']}" if r["heads"] else "-"
        table.add_row(
            r["name"],
            r["family"],
            fmt_params(r["params"]),
            str(r["d_model"]),
            str(r["layers"]),
            heads,
            _fmt_mlp(r),
            str(r["vocab"]),
            r["source"],
        )
    console.print(table)
    console.print(
        "legend: params = every weight, embeddings included (B = 10⁹); heads/kv = query heads / key-value "
        "heads; MLP = the MLP's inner width and its multiple of d_model; gated = SwiGLU's three "
        "matrices, not two. dense-7b is the TSP paper's 7B shape with a 4×-wide gated "
        "MLP, so 8.85B parameters: Llama-2-7B's gated MLP is 2.69× wide (11008) and has 6.74B.",
        highlight=False,
    )


def _fmt_mlp(row: dict) -> str:
    if not row["ffn_hidden"]:
        return "-"
    ratio = row["ffn_hidden"] / row["d_model"]
    return f"{'gated' if row['mlp_gated'] else 'plain'} {row['ffn_hidden']} ({ratio:.3g}×)"


@app.command()
@user_errors
def clusters(as_json: bool = typer.Option(False, "--json")):
    """List the cluster presets."""
    from meshplan.topologies.cluster import load_cluster, preset_names

    specs = [load_cluster(name) for name in preset_names()]
    rows = [
        {
            "name": c.name,
            "gpus": c.num_gpus,
            "gpu": c.gpu.name,
            "gpu_memory_bytes": c.gpu.memory_bytes,
            "bf16_tflops": c.gpu.bf16_flops_per_s / 1e12,
            "fabric": c.fabric,
            "link_gb_per_s": c.intra_link.bandwidth_bytes_per_s / 1e9,
            "nics_per_node": c.nics_per_node,
            "nic_gb_per_s": c.nic_link.bandwidth_bytes_per_s / 1e9,
        }
        for c in specs
    ]
    if as_json:
        _print_json(rows)
        return
    table = Table(title="cluster presets (one node each; --nodes N joins N of them)")
    for col in ("name", "GPUs", "GPU", "memory", "bf16 TFLOP/s", "intra-node", "NICs"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["name"],
            str(r["gpus"]),
            r["gpu"],
            fmt_bytes(r["gpu_memory_bytes"]),
            f"{r['bf16_tflops']:.0f}",
            f"{r['fabric']} {r['link_gb_per_s']:.0f} GB/s",
            f"{r['nics_per_node']} × {r['nic_gb_per_s']:g} GB/s",
        )
    console.print(table)
    console.print(
        "legend: memory = each GPU's; bf16 TFLOP/s = each GPU's dense peak; intra-node = the fabric and each "
        "GPU's bandwidth on it, each way; NICs = a node's network cards and each one's bandwidth, each way "
        "(GB = 10⁹ bytes)",
        highlight=False,
    )


# Nodes `cluster show` draws in full; the rest are alike and said in one line. And the most nodes
# whose graph --json prints (4,096 nodes: 17 MB of JSON in about 2 s).
SHOWN_NODES = 2
JSON_MAX_NODES = 4096


@cluster_app.command("show")
@user_errors
def cluster_show(
    name: str = typer.Argument(..., help="Preset name or TOML path."),
    nodes: Optional[int] = typer.Option(None, "--nodes"),
    as_json: bool = typer.Option(False, "--json"),
):
    """Draw a cluster's topology as a tree (the first nodes in full: every node is alike)."""
    from networkx.readwrite import json_graph

    from meshplan.topologies.cluster import build_graph, load_cluster

    spec = load_cluster(name, nodes)
    if as_json:
        if spec.nodes > JSON_MAX_NODES:
            raise MeshplanError(
                f"--json: {spec.nodes:,} nodes make a graph of {spec.num_gpus:,} GPUs, too large to print; "
                f"give --nodes {JSON_MAX_NODES} or fewer (every node is alike)"
            )
        _print_json(json_graph.node_link_data(build_graph(spec), edges="links"))
        return
    # Every node is built alike: draw the first ones from a graph of just them.
    drawn = min(spec.nodes, SHOWN_NODES)
    graph = build_graph(spec.with_nodes(drawn) if drawn < spec.nodes else spec)
    tree = Tree(f"[bold]{spec.name}[/] — {spec.num_gpus:,} × {spec.gpu.name}, {fmt_bytes(spec.gpu.memory_bytes)} each")
    bw = spec.intra_link.bandwidth_bytes_per_s / 1e9
    gpus_of: dict[int, list] = {}
    for g, d in graph.nodes(data=True):
        if d["kind"] == "gpu":
            gpus_of.setdefault(d["node"], []).append(g)
    nic_bw = spec.nic_link.bandwidth_bytes_per_s / 1e9
    target = "network switch" if spec.nodes > 1 else "no other node"
    for n in range(drawn):
        node = tree.add(f"node {n}")
        gpus = sorted(gpus_of[n], key=lambda g: graph.nodes[g]["local_rank"])
        if spec.fabric == "xgmi":
            fabric = node.add(f"xGMI full mesh: {len(gpus) * (len(gpus) - 1) // 2} links, {bw:g} GB/s each way")
        else:
            fabric = node.add(f"{spec.fabric} ({bw:g} GB/s each way per GPU)")
        for g in gpus:
            nics = [x for x in graph.neighbors(g) if graph.nodes[x]["kind"] == "nic"]
            fabric.add(f"{g} (rank {graph.nodes[g]['rank']}) → {', '.join(nics)}")
        node.add(f"{spec.nics_per_node} NICs × {nic_bw:g} GB/s → {target}")
    if spec.nodes > drawn:
        first, per = drawn, spec.gpus_per_node
        tree.add(
            f"nodes {first}–{spec.nodes - 1} ({spec.nodes - first:,} more): each as node {first - 1}, "
            f"GPUs n<node>/gpu0–{per - 1} holding ranks {first * per:,}–{spec.num_gpus - 1:,}"
        )
    console.print(tree)


def _check_folder(flag: str, path: str) -> None:
    """A file the command will write needs its folder to exist: say so before any work is done."""
    from pathlib import Path

    folder = Path(path).expanduser().parent
    if not folder.is_dir():
        raise MeshplanError(f"{flag}: folder {folder} does not exist; create it or write somewhere else")


def main() -> None:
    app()


if __name__ == "__main__":
    main()

"""Random plans a user could ask about — HF-shaped models (dense, GQA, Mamba-2, Mamba-1, hybrid, mixtures
of experts, DeepSeek's latent attention, mixed Mamba/attention/MLP/MoE stacks), clusters of
1 to 4,096 nodes, meshes, knobs, global batches, modes and stacks — and the rules every answer obeys,
checked from the outside: the estimates' own numbers against physics and an independent schedule
simulator, not against meshplan.costmodel.invariants (which checks the same rules from inside).

Used by tests/test_invariants.py (hypothesis draws the choices) and benchmarks/invariant_sweep.py
(a seeded random.Random draws them: the same sweep runs on any commit of the code, to count what
broke before a fix)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from meshplan.costmodel.axes import plan_context
from meshplan.costmodel.device import Device
from meshplan.costmodel.invariants import best_rate  # a lookup of the device's rates, not a rule
from meshplan.costmodel.memory import memory_per_gpu
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.pipeline import validate_batch
from meshplan.costmodel.pipeline_sim import simulate
from meshplan.costmodel.runtime import CONTEXT_BYTES, outside_allocator
from meshplan.costmodel.stacks import STACKS
from meshplan.costmodel.step import estimate_step, step_floor_s
from meshplan.errors import MeshplanError
from meshplan.layout import Layout, validate_layout, validate_seq
from meshplan.models import PRESETS, AttentionSpec, Mamba1Spec, Mamba2Spec, MlpSpec, ModelSpec, MoeSpec, dense, mamba2
from meshplan.predict import exposed_by
from meshplan.topologies import load_cluster

CLUSTERS = ("h100-sxm-8", "h200-8", "a100-sxm-8", "mi300x-8", "v100-dgx2-16")


@dataclass(frozen=True)
class RandomPlan:
    model: object
    cluster_name: str
    nodes: int
    layout: Layout
    seq: int
    micro_batch: int
    opts: CostOptions

    def __str__(self) -> str:
        o = self.opts
        return (
            f"{self.model.name} on {self.nodes}×{self.cluster_name} {self.layout} seq {self.seq} mb {self.micro_batch} "
            f"{o.mode} stack {o.stack} gbs {o.global_batch} v {o.virtual_stages} rc {o.recompute} "
            f"{','.join(o.recompute_modules)} tp-sp {o.tp_sequence_parallel}"
        )


def random_model(choose, integer):
    """A model of random HF-like shape: dense (MHA or GQA), Mamba-2, Mamba-1, a Zamba2-like hybrid, a
    mixture of experts (with DeepSeek's latent attention or not), or a mixed stack of Mamba, attention,
    MLP and MoE layers (Nemotron-H, Granite 4.0-H, Jamba)."""
    family = choose(["dense", "dense", "mamba2", "hybrid", "mamba1", "moe", "mla", "mixed"])
    layers = integer(1, 128)
    if family == "mixed":
        return _random_mixed(choose, integer)
    if family in ("moe", "mla"):
        base = random_model(lambda xs: "dense" if "dense" in xs else choose(xs), integer)
        moe = _random_moe(base.d_model, choose, integer)
        if family == "mla":  # DeepSeek's: a latent for K/V (and for queries, or none), rope and value heads
            heads, rope = base.attention.heads, choose([32, 64])
            attention = AttentionSpec(
                base.d_model,
                heads,
                heads,
                choose([64, 128]) + rope,
                base.d_model,
                kv_lora_rank=choose([256, 512]),
                q_lora_rank=choose([0, 768, 1536]),
                rope_head_dim=rope,
                v_head_dim=choose([64, 128]),
            )
            mtp = choose([0, 0, 1]) if base.layers > 1 else 0  # DeepSeek-V3's MTP module as the last layer
            base = replace(base, attention=attention, mtp_layers=mtp)
        dense_ids = tuple(sorted({i for i in range(base.layers) if choose([0, 0, 0, 1])}))[: base.layers - 1]
        return replace(
            base,
            name=f"{family}-{moe.experts}x-{base.layers}L",
            family="moe",
            moe=moe,
            dense_layer_ids=dense_ids,
            mlp=base.mlp if dense_ids else None,
        )
    if family == "dense":
        head_dim = choose([64, 128])
        heads = choose([8, 16, 32, 40, 64, 96, 128])
        kv = choose([h for h in (1, 2, 4, 8, heads) if heads % h == 0])
        ffn = head_dim * heads * choose([2, 3, 4]) + choose([0, 256])
        vocab = choose([32000, 50304, 128256, 151936])
        return dense(
            f"dense-{heads}x{head_dim}-{layers}L", heads * head_dim, layers, heads, kv, ffn, vocab, tied=choose([0, 1])
        )
    if family == "mamba2":
        d_model = 256 * integer(2, 24)
        return mamba2(f"mamba2-{d_model}-{layers}L", d_model, layers, 50288, ngroups=choose([1, 2, 8]))
    preset = PRESETS["zamba2-7b" if family == "hybrid" else "falcon-mamba-7b"]
    if family == "hybrid":
        layers = max(layers, preset.hybrid_layers)
    return replace(preset, layers=layers, name=f"{preset.name}-{layers}L")


def _random_moe(hidden: int, choose, integer) -> MoeSpec:
    experts = choose([4, 8, 16, 64, 128])
    return MoeSpec(
        hidden,
        experts,
        choose([k for k in (1, 2, 4, 8) if k <= experts]),
        64 * integer(2, 64),
        gated=bool(choose([1, 1, 0])),
        shared_ffn=choose([0, 0, 128 * integer(1, 16)]),
        shared_gate=bool(choose([0, 1])),
        expert_bias=bool(choose([0, 0, 1])),
    )


def _random_mixed(choose, integer) -> ModelSpec:
    """Layers of one block each (Nemotron-H) or a mixer then an MLP or MoE (Granite 4.0-H, Jamba),
    over Mamba-2 or Mamba-1; only the specs its layers run."""
    head_dim, heads = choose([64, 128]), choose([8, 16, 32])
    hidden = head_dim * heads
    ssm = choose(["mamba2", "mamba1"])
    moe = _random_moe(hidden, choose, integer)
    ffn = {"mlp": ("mlp",), "moe": ("router", "experts") + (("shared_expert",) if moe.shared_ffn else ())}
    one_block = bool(choose([0, 1]))
    kinds = []
    for _ in range(integer(1, 64)):
        mixer = choose([ssm, ssm, "attention"])
        if one_block:
            kinds.append(choose([(mixer,), (mixer,), ffn[choose(["mlp", "moe"])]]))
        else:
            kinds.append((mixer,) + ffn[choose(["mlp", "moe", "moe"])])
    used = {kind for layer in kinds for kind in layer}
    specs = {
        "attention": AttentionSpec(
            hidden, heads, choose([h for h in (1, 2, 8, heads) if heads % h == 0]), head_dim, hidden
        ),
        "mlp": MlpSpec(hidden, 64 * integer(4, 96), gated=bool(choose([0, 1]))),
        "mamba2": Mamba2Spec(hidden, d_state=choose([64, 128]), headdim=choose([32, 64]), ngroups=choose([1, 2, 8])),
        "mamba1": Mamba1Spec(hidden, dt_bc_norms=bool(choose([0, 1]))),
        "moe": moe,
    }
    keep = {part: spec for part, spec in specs.items() if part in used or (part == "moe" and "router" in used)}
    return ModelSpec(
        name=f"mixed-{ssm}-{len(kinds)}L",
        family="mixed",
        d_model=hidden,
        layers=len(kinds),
        vocab=choose([32000, 131072]),
        layer_kinds=tuple(kinds),
        **keep,
    )


def random_plan(choose, integer) -> RandomPlan:
    """One plan; `choose(options)` picks one of a list, `integer(lo, hi)` an integer in [lo, hi]. Plans
    that do not validate raise MeshplanError (the caller draws again)."""
    model = random_model(choose, integer)
    name = choose(CLUSTERS)
    nodes = choose([1, 1, 2, 4, 8, 16, 64, 128, 1024, 4096])
    cluster = load_cluster(name, nodes)
    n = cluster.num_gpus
    dp = choose(_divisors(n))
    pp = choose([p for p in _divisors(n // dp) if p <= max(model.layers, 1)])
    mp = n // dp // pp
    tensor = "tpssm" if model.has_mamba else "tp"
    shapes = [{}] if mp == 1 else [{tensor: mp}, {"sp": mp}, {"tsp": mp}]
    shapes += [{tensor: t, "sp": mp // t} for t in _divisors(mp) if 1 < t < mp]
    mode = choose(["train", "train", "train", "prefill", "decode"])
    zero = choose([0, 1, 2, 3]) if mode == "train" and dp > 1 else 0
    shape = choose(shapes)
    # A mixture of experts: the experts' own decomposition of the stage's ranks (etp × ep × edp).
    experts: dict = {}
    if model.moe is not None:
        degree = shape.get("tp", 1) * shape.get("tpssm", 1)
        etp = choose([degree, 1])
        eps = [e for e in _divisors(dp * mp // etp) if model.moe.experts % e == 0]
        experts = {"ep": choose(eps)} | ({"etp": etp} if etp != degree else {})
    layout = Layout(dp=dp, pp=pp, zero=zero, **experts, **shape)
    validate_layout(layout, model, n)
    seq = 1024 * choose([1, 2, 4, 8, 16, 32, 128])
    micro_batch = choose([1, 1, 2, 4, 8])
    validate_seq(layout, seq, micro_batch)
    v = choose([1, 1, 2, 3, 4, 8]) if pp > 1 and mode == "train" else 1
    steps = choose([1, 2, 3, 4, 8, 16, 32])
    recompute = choose(["none", "selective", "full"])
    # Megatron's selective recompute by module, now and then (CostOptions.recompute_modules)
    modules = ("core_attn",)
    if recompute == "selective":
        modules = choose([modules, modules, ("moe",), ("moe", "layernorm"), ("layernorm", "moe_act"), ("mlp",)])
    opts = CostOptions(
        mode=mode,
        stack=choose(sorted(STACKS)),
        recompute=recompute,
        recompute_modules=modules,
        tp_sequence_parallel=bool(choose([0, 1])),
        global_batch=dp * micro_batch * steps if mode == "train" else 0,
        schedule="interleaved" if v > 1 else "1f1b",
        virtual_stages=v,
        **(_moe_options(choose) if model.moe is not None else {}),
        # Context parallelism's exchange: the stack's, or each of Megatron's three
        cp_comm_type=choose(["", "", "allgather", "p2p", "a2a"]) if layout.sp > 1 else "",
        **(_production_layout(choose, integer, model, pp, v) if pp > 1 and mode == "train" else {}),
    )
    validate_batch(
        model.layers, pp, dp, micro_batch, opts.global_batch, opts.chunks, opts=opts, mtp_layers=model.mtp_layers
    )
    return RandomPlan(model, name, nodes, layout, seq, micro_batch, opts)


def _production_layout(choose, integer, model, pp: int, v: int) -> dict:
    """Now and then a pipeline laid out as production runs it (meshplan.costmodel.pipeline.stage_layout):
    the embedding and loss counted as layers, or a --pipeline-layout string of chunks of random sizes
    (empty ones too) — the decoder layers cut at pp·v − 1 random points, the MTP layers last."""
    kind = choose(["none", "none", "account", "string"])
    if kind == "account":
        return {"account_for_embedding": bool(choose([0, 1])), "account_for_loss": bool(choose([0, 1]))}
    if kind == "none":
        return {}
    decoder = model.layers - model.mtp_layers
    cuts = sorted(integer(0, decoder) for _ in range(pp * v - 1))
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [decoder])]
    stages = ["t" * n for n in sizes]
    stages[0], stages[-1] = "E" + stages[0], stages[-1] + "m" * model.mtp_layers + "L"
    return {"pipeline_layout": "|".join(stages)}


def _moe_options(choose) -> dict:
    """The mixture-of-experts options: a dispatcher, dropless at some imbalance or a capacity (padded or
    not), the 1F1B all-to-all overlap."""
    dispatcher = choose(["alltoall", "allgather", "deepep"])
    capacity = choose([0.0, 0.0, 1.0, 1.25, 0.5])
    pad = bool(capacity) and dispatcher != "deepep" and bool(choose([0, 1]))
    return {
        "moe_dispatcher": dispatcher,
        "capacity_factor": capacity,
        "moe_pad_to_capacity": pad,
        "moe_imbalance": choose([1.0, 1.0, 1.2, 2.0]),
        "deepep_node_limit": dispatcher == "deepep" and bool(choose([0, 1])),
        "moe_a2a_overlap": bool(choose([0, 0, 1])),
    }


def _divisors(n: int) -> list[int]:
    return (
        [d for d in range(1, n + 1) if n % d == 0] if n <= 4096 else [d for d in (1, 2, 4, 8, 16, 64, n) if n % d == 0]
    )


PARTS = ("compute_s", "bubble_s", "exposed_comm_s", "optimizer_s", "launch_wait_s")


def violations(plan: RandomPlan) -> list[str]:
    """The rules the plan's answer breaks (empty: none). A plan the stack cannot run must be refused
    (a MeshplanError naming the rule), never priced."""
    cluster = load_cluster(plan.cluster_name, plan.nodes)
    model, layout, seq, mb, opts = plan.model, plan.layout, plan.seq, plan.micro_batch, plan.opts
    try:
        est = estimate_step(model, layout, seq, mb, opts, cluster)
    except MeshplanError:
        return []  # refused in one line: nothing priced, nothing to break
    out: list[str] = []
    if opts.training and _stack_cannot_run(plan, est.microbatches):
        out.append("priced a schedule its stack cannot run")
    step = est.step_time_s
    tol = 1e-9 * step
    parts = {k: getattr(est, k, 0.0) for k in PARTS}
    if any(v < -tol for v in parts.values()) or any(v < -tol for k, v in est.breakdown.items() if k.endswith("_s")):
        out.append("a negative time")
    if abs(sum(parts.values()) - step) > 1e-6 * step:
        out.append("step is not the sum of its parts")
    if est.exposed_comm_s > est.comm_s * (1 + 1e-6) + tol:
        out.append("exposed communication above all communication")
    if opts.training and abs(sum(exposed_by(est).values()) - est.exposed_comm_s) > 1e-6 * step + tol:
        out.append("exposed communication by owner does not sum to it")
    dev = Device.of(cluster, opts.stack_spec)
    if est.hfu > best_rate(dev) * (1 + 1e-6):
        out.append("HFU above the stack's best achieved rate")
    if est.mfu > est.hfu * (1 + 1e-9):
        out.append("MFU above HFU")
    # The label: the host when its launches set the step, else the largest share.
    largest = "launch_wait_s" if parts["launch_wait_s"] > 0 else max(parts, key=parts.get)
    label = {"compute_s": "compute", "bubble_s": "pipeline", "exposed_comm_s": "communication"}.get(largest)
    if largest == "launch_wait_s":
        label = "launch"
    if label and not est.bound.startswith(label) and not opts.mode == "decode":
        out.append("the label is not the largest share")
    if opts.training and step_floor_s(plan_context(model, layout, seq, mb, opts), cluster) > step * (1 + 1e-9):
        out.append("the planner's floor above the step it prices")
    if opts.training and layout.pp > 1:
        out += _bubble_violations(plan, cluster)
    if model.attention is not None and opts.mode != "decode":
        out += _attention_linear(plan, cluster, est)
    return out


def _stack_cannot_run(plan: RandomPlan, microbatches: int) -> bool:
    """The stacks' own rules, restated from their sources (meshplan.costmodel.stacks cites them)."""
    stack, layout, v = plan.opts.stack_spec, plan.layout, plan.opts.chunks
    min_pp = {"megatron": 2, "megatron-2021": 3, "llama3": 2}.get(stack.name, 0)  # 0: no interleaved schedule
    if v > 1 and (not min_pp or layout.pp < min_pp or microbatches % layout.pp or microbatches < layout.pp):
        return True
    max_zero = {"megatron-2021": 0}.get(stack.name, 3)
    # Llama 3 (arXiv 2407.21783 §3.3.2): FSDP without resharding after forward, ZeRO-2-like under pipelining
    max_zero_pp = {"megatron": 1, "megatron-2021": 0, "deepspeed": 1, "llama3": 2}.get(stack.name, 3)
    return layout.zero > max_zero or (layout.pp > 1 and layout.zero > max_zero_pp)


def _bubble_violations(plan: RandomPlan, cluster) -> list[str]:
    """The layer stack alone on stages of equal, alike layers: every stage takes the same time, so the
    bubble is the schedule's own, which the simulator gives for (p, m, v) whatever the stage's time."""
    model, layout = plan.model, plan.layout
    if not model.uniform_layers:  # stages of equal layer counts but different layers (a hybrid's)
        return []
    if model.layers % layout.pp or (plan.opts.chunks > 1 and (model.layers // layout.pp) % plan.opts.chunks):
        return []
    try:
        est = estimate_step(model, layout, plan.seq, plan.micro_batch, plan.opts, cluster, embeddings=False)
    except MeshplanError:
        return []
    if est.chunk_layers or len(set(est.stage_layers)) > 1:  # a production layout's unequal stages or chunks
        return []
    m, v = est.microbatches, plan.opts.chunks
    sim = simulate([[1 / v] * v] * layout.pp, [[2 / v] * v] * layout.pp, m, chunks=v)
    truth = 1 - sim.busy_s[0] / sim.total_s
    if abs(est.bubble_fraction - truth) > 1e-6:
        return [f"bubble {est.bubble_fraction:.4f} is not the schedule's {truth:.4f} (p={layout.pp}, m={m}, v={v})"]
    return []


def _attention_linear(plan: RandomPlan, cluster, est) -> list[str]:
    """Attention is per sequence: twice the micro-batch, twice the attention time."""
    opts = replace(plan.opts, global_batch=plan.opts.global_batch * 2) if plan.opts.global_batch else plan.opts
    try:
        twice = estimate_step(plan.model, plan.layout, plan.seq, 2 * plan.micro_batch, opts, cluster)
    except MeshplanError:
        return []
    one, two = est.breakdown.get("attention_s", 0.0), twice.breakdown.get("attention_s", 0.0)
    if not math.isclose(two, 2 * one, rel_tol=1e-9, abs_tol=1e-15):
        return [f"attention not linear in the micro-batch ({one:.3e} s at {plan.micro_batch}, {two:.3e} s at twice)"]
    return []


def memory_violations(plan: RandomPlan) -> list[str]:
    """Memory never shrinks when work grows: twice the sequence needs no fewer bytes in all, nor
    fewer activation bytes at the same peak phase; twice the micro-batch (as many micro-batches) no
    fewer bytes; twice the ranks on a weight-splitting axis hold no more parameter bytes."""
    model, layout, seq, mb, opts = plan.model, plan.layout, plan.seq, plan.micro_batch, plan.opts
    out = []
    try:
        base = memory_per_gpu(model, layout, seq, mb, opts)
        longer = memory_per_gpu(model, layout, 2 * seq, mb, opts)
    except MeshplanError:
        return []
    if longer.total_bytes < base.total_bytes * (1 - 1e-12):
        out.append("memory shrinks when the sequence grows")
    if opts.training:
        # Twice the sequences a micro-batch, as many micro-batches (with fewer, a plan whose gradients are
        # made in the one backward can peak lower: the optimizer's step, not the accumulation).
        more = replace(opts, global_batch=2 * opts.global_batch) if opts.global_batch else opts
        try:
            validate_seq(layout, seq, 2 * mb)
            twice = memory_per_gpu(model, layout, seq, 2 * mb, more)
        except MeshplanError:
            twice = None
        if twice is not None and twice.total_bytes < base.total_bytes * (1 - 1e-12):
            out.append("memory shrinks when the micro-batch doubles")
    # Beside the allocator (the CUDA context, NCCL's buffers): at least the context; the same for any
    # length (the step's groups do not depend on it); a training step on several GPUs opens a communicator.
    beside = outside_allocator(model, layout, seq, opts, 8)
    if beside.total_bytes < (opts.stack_spec.cuda_context_bytes or CONTEXT_BYTES):
        out.append("less beside the allocator than the CUDA context")
    if outside_allocator(model, layout, 2 * seq, opts, 8).total_bytes != beside.total_bytes:
        out.append("what lies beside the allocator changes with the sequence")
    if opts.training and layout.world_size > 1 and not beside.communicators:
        out.append("a multi-GPU training step opens no communicator")
    same_phase = getattr(longer, "peak_phase", None) == getattr(base, "peak_phase", None)
    if same_phase and longer.per_gpu_bytes["activations"] < base.per_gpu_bytes["activations"] * (1 - 1e-12):
        out.append("activations shrink when the sequence grows")
    for axis in ("tp", "tpssm", "tsp"):
        if getattr(layout, axis) > 1:
            wider = replace(layout, **{axis: getattr(layout, axis) * 2})
            try:
                validate_layout(wider, model)
                validate_seq(wider, seq, mb)
                split = memory_per_gpu(model, wider, seq, mb, opts)
            except MeshplanError:
                continue
            # The same pipeline stage only: where layers differ (a mixed model's), stages hold different weights.
            same_stage = split.pipeline_stage == base.pipeline_stage
            if same_stage and split.per_gpu_bytes["parameters"] > base.per_gpu_bytes["parameters"] * (1 + 1e-12):
                out.append(f"parameters grow when {axis} doubles")
    return out

"""Cluster descriptions: TOML files (or presets) → frozen ClusterSpec → networkx graph.

TOML layout (every key required unless marked; an unknown key is an error naming it):

    name = "h100-sxm-8"
    nodes = 1                  # optional, default 1
    gpus_per_node = 8
    [gpu]        name, memory_bytes, bf16_tflops, hbm_tb_per_s,
                 fp8_tflops (optional: the dense FP8 tensor-core peak; none: the GPU runs no FP8 GEMMs)
    [intra_node] fabric ("nvswitch" | "xgmi" | "pcie"), link_gb_per_s, latency_us
    [inter_node] nics_per_node, nic_gb_per_s, latency_us,
                 nodes_per_leaf (optional: nodes under one leaf switch; default all of them),
                 oversubscription (optional: leaf uplinks against downlinks, e.g. 2 for 2:1; default 1)

Bandwidths are per direction, in GB/s (1e9 bytes/s).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import tomllib

from meshplan.errors import MeshplanError

FABRICS = ("nvswitch", "xgmi", "pcie")


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int
    bf16_flops_per_s: float
    hbm_bytes_per_s: float
    fp8_flops_per_s: float = 0.0  # dense FP8 tensor-core peak; 0: none (--precision fp8 is refused)


@dataclass(frozen=True)
class LinkSpec:
    bandwidth_bytes_per_s: float  # per direction
    latency_s: float


@dataclass(frozen=True)
class Calibration:
    """What `meshplan calibrate` measured on a real cluster; each field None where not measured."""

    date: str = ""
    command: str = ""
    gemm_efficiency: float | None = None
    hbm_bytes_per_s: float | None = None
    attention_causal: tuple[tuple[int, float], ...] | None = None  # (keys, achieved / peak)
    attention_prefix: tuple[tuple[int, float], ...] | None = None
    # "kind/group_size" → (alpha_s, algorithm bandwidth in bytes/s): time = alpha + message / bandwidth
    collectives: tuple[tuple[str, float, float], ...] = ()
    # "kind/group_size" → the measured (message bytes, seconds) the fit came from, by size (collective_s reads
    # between them: NCCL's time is not one line over 64 KiB-1 GiB — send/recv over 4 H200s ran 16-64 MiB at
    # 119-127 GB/s and 256-512 MiB at 297-350, benchmarks/results/s26-h200x4-nccl/)
    points: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = ()
    # Host seconds the eager executor spends per kernel it launches, in attention / MLP blocks and in
    # Mamba-2 blocks, training and prefill or decode: the cost model's launch floor under a small step.
    host_kernel_s: float | None = None
    decode_host_kernel_s: float | None = None
    mamba2_host_kernel_s: float | None = None
    mamba2_decode_host_kernel_s: float | None = None

    def collective(self, kind: str, n: int) -> tuple[float, float] | None:
        for key, alpha, bw in self.collectives:
            if key == f"{kind}/{n}":
                return alpha, bw
        return None

    def collective_s(self, kind: str, n: int, message: float) -> float | None:
        """One `kind` over `n` ranks of `message` bytes as measured: between two measured sizes, the line
        through them (a collective's time is affine in its size within one of NCCL's regimes); outside them, or
        with fewer than two, the α-β fit. None where the profile did not time it."""
        fit = self.collective(kind, n)
        if fit is None:
            return None
        pts = next((p for key, p in self.points if key == f"{kind}/{n}"), ())
        for (m0, t0), (m1, t1) in zip(pts, pts[1:]):
            if m0 <= message <= m1 and m1 > m0:
                return t0 + (t1 - t0) * (message - m0) / (m1 - m0)
        return fit[0] + message / fit[1]


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    nodes: int
    gpus_per_node: int
    gpu: GpuSpec
    fabric: str
    intra_link: LinkSpec  # nvswitch/pcie: GPU ↔ switch; xgmi: each GPU ↔ peer link
    nics_per_node: int
    nic_link: LinkSpec
    source: str = ""
    calibration: Calibration | None = None
    # The network above the NICs: a fat tree whose leaf switches each take `nodes_per_leaf` nodes (0: one
    # leaf for the whole cluster) and whose uplinks carry 1/`oversubscription` of the leaf's downlinks.
    # Rail-optimized clusters (GPU i of every node on rail switch i) and non-blocking fat trees (Selene's
    # three levels, Narayanan et al. 2021 §5) are oversubscription 1.
    nodes_per_leaf: int = 0
    oversubscription: float = 1.0

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise MeshplanError(f"cluster {self.name}: nodes and gpus_per_node must be >= 1")
        if self.fabric not in FABRICS:
            raise MeshplanError(
                f"cluster {self.name}: intra_node.fabric {self.fabric!r} unknown; use {', '.join(FABRICS)}"
            )
        if self.nics_per_node < 1:
            raise MeshplanError(f"cluster {self.name}: inter_node.nics_per_node must be >= 1")
        if self.oversubscription < 1:
            raise MeshplanError(
                f"cluster {self.name}: inter_node.oversubscription must be >= 1 (uplinks : downlinks "
                f"as 2 for 2:1), got {self.oversubscription}"
            )

    def inter_node_bandwidth(self, nodes_spanned: int) -> float:
        """Bytes/s each GPU gets across nodes for a group over `nodes_spanned` nodes: its share of the
        node's NICs, cut by the oversubscription once the group leaves one leaf switch."""
        per_gpu = self.nic_link.bandwidth_bytes_per_s * self.nics_per_node / self.gpus_per_node
        beyond_leaf = self.nodes_per_leaf and nodes_spanned > self.nodes_per_leaf
        return per_gpu / self.oversubscription if beyond_leaf else per_gpu

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def with_nodes(self, nodes: int) -> "ClusterSpec":
        if nodes < 1:
            raise MeshplanError(f"--nodes must be >= 1, got {nodes}")
        if nodes == self.nodes:
            return self
        return replace(self, nodes=nodes, name=f"{nodes}×{self.name}")


# [calibration]'s host cost per launched kernel, in µs: attention / MLP and Mamba-2 blocks, steps and decode.
HOST_KEYS = ("host_kernel_us", "decode_host_kernel_us", "mamba2_host_kernel_us", "mamba2_decode_host_kernel_us")
_SCHEMA: dict[str, tuple[str, ...]] = {
    "": ("name", "nodes", "gpus_per_node", "gpu", "intra_node", "inter_node", "calibration"),
    "calibration": (
        "date",
        "command",
        "gemm_efficiency",
        "hbm_tb_per_s",
        "attention_causal",
        "attention_prefix",
        "collectives",
    )
    + HOST_KEYS,
    "gpu": ("name", "memory_bytes", "bf16_tflops", "hbm_tb_per_s", "fp8_tflops"),
    "intra_node": ("fabric", "link_gb_per_s", "latency_us"),
    "inter_node": ("nics_per_node", "nic_gb_per_s", "latency_us", "nodes_per_leaf", "oversubscription"),
}
_OPTIONAL = {
    ("", "nodes"),
    ("", "calibration"),
    ("gpu", "fp8_tflops"),
    ("inter_node", "nodes_per_leaf"),
    ("inter_node", "oversubscription"),
} | {
    ("calibration", k)
    for k in (
        "date",
        "command",
        "gemm_efficiency",
        "hbm_tb_per_s",
        "attention_causal",
        "attention_prefix",
        "collectives",
    )
    + HOST_KEYS
}
_NUMERIC = {
    "memory_bytes",
    "bf16_tflops",
    "fp8_tflops",
    "hbm_tb_per_s",
    "link_gb_per_s",
    "latency_us",
    "nics_per_node",
    "nodes_per_leaf",
    "oversubscription",
    "nic_gb_per_s",
    "nodes",
    "gpus_per_node",
    "gemm_efficiency",
    *HOST_KEYS,
}
_WHOLE = {
    "memory_bytes",
    "nics_per_node",
    "nodes",
    "gpus_per_node",
    "nodes_per_leaf",
}  # counts: 1.5 nodes is a typo, not a cluster


def _check_table(table: dict[str, Any], section: str, where: str) -> None:
    allowed = _SCHEMA[section]
    prefix = f"[{section}] " if section else ""
    for key, value in table.items():
        if key not in allowed:
            hint = difflib.get_close_matches(key, allowed, n=1)
            fix = f"did you mean {hint[0]!r}?" if hint else f"allowed: {', '.join(allowed)}"
            raise MeshplanError(f"{where}: unknown key {prefix}{key!r}; {fix}")
        if key in _NUMERIC and (not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0):
            raise MeshplanError(f"{where}: {prefix}{key} must be a positive number, got {value!r}")
        if key in _WHOLE and value != int(value):
            raise MeshplanError(f"{where}: {prefix}{key} must be a whole number, got {value!r}")
    for key in allowed:
        if key not in table and (section, key) not in _OPTIONAL:
            raise MeshplanError(f"{where}: missing key {prefix}{key!r}")


def cluster_from_dict(data: dict[str, Any], where: str) -> ClusterSpec:
    _check_table(data, "", where)
    for section in ("gpu", "intra_node", "inter_node"):
        if not isinstance(data[section], dict):
            raise MeshplanError(f"{where}: {section} must be a table ([{section}])")
        _check_table(data[section], section, where)
    gpu, intra, inter = data["gpu"], data["intra_node"], data["inter_node"]
    calibration = None
    if "calibration" in data:
        if not isinstance(data["calibration"], dict):
            raise MeshplanError(f"{where}: calibration must be a table ([calibration])")
        _check_table(data["calibration"], "calibration", where)
        calibration = _calibration(data["calibration"], where)
    return ClusterSpec(
        name=str(data["name"]),
        nodes=int(data.get("nodes", 1)),
        gpus_per_node=int(data["gpus_per_node"]),
        gpu=GpuSpec(
            str(gpu["name"]),
            int(gpu["memory_bytes"]),
            gpu["bf16_tflops"] * 1e12,
            gpu["hbm_tb_per_s"] * 1e12,
            gpu.get("fp8_tflops", 0.0) * 1e12,
        ),
        fabric=str(intra["fabric"]),
        intra_link=LinkSpec(intra["link_gb_per_s"] * 1e9, intra["latency_us"] * 1e-6),
        nics_per_node=int(inter["nics_per_node"]),
        nic_link=LinkSpec(inter["nic_gb_per_s"] * 1e9, inter["latency_us"] * 1e-6),
        source=where,
        calibration=calibration,
        nodes_per_leaf=int(inter.get("nodes_per_leaf", 0)),
        oversubscription=float(inter.get("oversubscription", 1.0)),
    )


def _pairs(value, key: str, where: str) -> tuple[tuple[int, float], ...]:
    try:
        pairs = tuple((int(k), float(v)) for k, v in value)
    except (TypeError, ValueError):
        raise MeshplanError(f"{where}: calibration.{key} must be a list of [keys, efficiency] pairs") from None
    if not pairs or any(k <= 0 or not 0 < v <= 1 for k, v in pairs):
        raise MeshplanError(f"{where}: calibration.{key} needs positive key counts and efficiencies in (0, 1]")
    return tuple(sorted(pairs))


def _calibration(cal: dict, where: str) -> Calibration:
    collectives, points = [], []
    for key, entry in (cal.get("collectives") or {}).items():
        kind, _, n = key.partition("/")
        if not n.isdigit() or not isinstance(entry, dict) or "alpha_us" not in entry or "algbw_gb_per_s" not in entry:
            raise MeshplanError(
                f"{where}: calibration.collectives.{key!r} must be 'kind/size' = "
                "{{alpha_us = …, algbw_gb_per_s = …}}"
            )
        collectives.append((key, float(entry["alpha_us"]) * 1e-6, float(entry["algbw_gb_per_s"]) * 1e9))
        try:
            measured = sorted((float(m), float(t)) for m, t in entry.get("points", ()))
        except (TypeError, ValueError):
            raise MeshplanError(
                f"{where}: calibration.collectives.{key!r}.points must be [message bytes, seconds] pairs"
            ) from None
        if measured:
            points.append((key, tuple(measured)))
    gemm = cal.get("gemm_efficiency")
    if gemm is not None and not 0 < gemm <= 1:
        raise MeshplanError(f"{where}: calibration.gemm_efficiency must be in (0, 1], got {gemm}")
    return Calibration(
        date=str(cal.get("date", "")),
        command=str(cal.get("command", "")),
        gemm_efficiency=gemm,
        hbm_bytes_per_s=cal["hbm_tb_per_s"] * 1e12 if "hbm_tb_per_s" in cal else None,
        attention_causal=_pairs(cal["attention_causal"], "attention_causal", where)
        if "attention_causal" in cal
        else None,
        attention_prefix=_pairs(cal["attention_prefix"], "attention_prefix", where)
        if "attention_prefix" in cal
        else None,
        collectives=tuple(collectives),
        points=tuple(points),
        **{key.replace("_us", "_s"): cal[key] * 1e-6 for key in HOST_KEYS if key in cal},
    )


def load_toml(path: Path) -> ClusterSpec:
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as exc:
        raise MeshplanError(f"{path}: not valid TOML ({exc})") from None
    except OSError as exc:
        raise MeshplanError(f"{path}: cannot read ({exc.strerror})") from None
    return cluster_from_dict(data, str(path))


def preset_names() -> list[str]:
    folder = resources.files("meshplan.topologies") / "presets"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_cluster(name_or_path: str, nodes: int | None = None) -> ClusterSpec:
    """A preset name or a TOML path; `nodes` replicates the node over the preset's network."""
    if name_or_path in preset_names():
        text = (resources.files("meshplan.topologies") / "presets" / f"{name_or_path}.toml").read_text()
        cluster = cluster_from_dict(tomllib.loads(text), f"preset {name_or_path}")
    elif Path(name_or_path).exists():
        cluster = load_toml(Path(name_or_path))
    else:
        raise MeshplanError(
            f"--cluster: {name_or_path!r} is neither a preset ({', '.join(preset_names())}) nor an existing TOML path"
        )
    return cluster.with_nodes(nodes) if nodes is not None else cluster


# -- graph ------------------------------------------------------------------------------------


def gpu_id(node: int, local: int) -> str:
    return f"n{node}/gpu{local}"


def build_graph(cluster: ClusterSpec):
    """GPUs, intra-node switches (or the xGMI mesh), NICs and the network switch as a graph.

    Node attribute `kind`: gpu | switch | nic. Edge attributes: `link` (nvlink, xgmi, pcie, nic,
    network), `bandwidth_bytes_per_s` (per direction), `latency_s`.
    """
    import networkx as nx

    g = nx.Graph(name=cluster.name)
    intra = cluster.intra_link
    link_name = {"nvswitch": "nvlink", "xgmi": "xgmi", "pcie": "pcie"}[cluster.fabric]
    per_nic = max(1, cluster.gpus_per_node // cluster.nics_per_node)
    if cluster.nodes > 1:
        g.add_node("network", kind="switch", role="network")
    for n in range(cluster.nodes):
        gpus = [gpu_id(n, j) for j in range(cluster.gpus_per_node)]
        for j, gid in enumerate(gpus):
            g.add_node(gid, kind="gpu", node=n, local_rank=j, rank=n * cluster.gpus_per_node + j)
        if cluster.fabric == "xgmi":
            for a in range(len(gpus)):
                for b in range(a + 1, len(gpus)):
                    g.add_edge(
                        gpus[a],
                        gpus[b],
                        link=link_name,
                        bandwidth_bytes_per_s=intra.bandwidth_bytes_per_s,
                        latency_s=intra.latency_s,
                    )
        else:
            switch = f"n{n}/{cluster.fabric}"
            g.add_node(switch, kind="switch", role=cluster.fabric, node=n)
            for gid in gpus:
                g.add_edge(
                    gid,
                    switch,
                    link=link_name,
                    bandwidth_bytes_per_s=intra.bandwidth_bytes_per_s,
                    latency_s=intra.latency_s,
                )
        for k in range(cluster.nics_per_node):
            nic = f"n{n}/nic{k}"
            g.add_node(nic, kind="nic", node=n)
            for gid in gpus[k * per_nic : (k + 1) * per_nic] or gpus[-1:]:
                # GPUDirect RDMA: the NIC reads GPU memory over its PCIe switch at the NIC's rate.
                g.add_edge(
                    gid, nic, link="nic", bandwidth_bytes_per_s=cluster.nic_link.bandwidth_bytes_per_s, latency_s=0.0
                )
            if cluster.nodes > 1:
                g.add_edge(
                    nic,
                    "network",
                    link="network",
                    bandwidth_bytes_per_s=cluster.nic_link.bandwidth_bytes_per_s,
                    latency_s=cluster.nic_link.latency_s,
                )
    return g

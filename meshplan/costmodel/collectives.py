"""Collectives: what one moves (volume per rank) and what it costs on a group of GPUs (α-β).

Volume, per rank, for ring algorithms (docs/design.md §5): all-reduce 2(n−1)/n·M, all-gather and
reduce-scatter (n−1)/n·M, all-to-all (n−1)/n·M, broadcast (n−1)/n·M averaged over ranks (every
rank but the root receives M), send/recv M per hop. M is the full buffer: the all-reduced tensor,
the all-gather output, the reduce-scatter input, the broadcast tensor, one hop's tensor.

Time: α per algorithm step plus the bandwidth term, on the group's bottleneck link; all-reduce takes
the faster of ring and double binary tree; a group that spans nodes runs hierarchically
(reduce-scatter inside the node, the rest across, all-gather inside) — but an all-to-all, whose
bytes to other nodes cannot be combined, sends over NVLink and the NIC at once. Message-size efficiency is the
α-β curve itself, M / (M + α·β⁻¹·steps); calibrated profiles replace α and β per collective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def volume_factor(kind: str, n: int) -> float:
    if n <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind == "send_recv":
        return 1.0
    return (n - 1) / n


def _time_factor_and_steps(kind: str, n: int) -> tuple[float, int]:
    """(bandwidth multiplier on M, latency steps) for the ring / pipelined-chain algorithms."""
    if kind == "all_reduce":
        return 2 * (n - 1) / n, 2 * (n - 1)
    if kind == "broadcast":
        return 1.0, n - 1  # pipelined chain: M crosses each link once
    if kind == "send_recv":
        return 1.0, 1
    return (n - 1) / n, n - 1


@dataclass(frozen=True)
class Comm:
    """One entry of a layer's communication schedule."""

    kind: str
    axis: str  # mesh axis: tp, sp, tsp, tpssm, dp, pp, ep, edp (or "dp+sp" for the merged gradient group)
    message_bytes: float
    group_size: int
    count: int = 1  # how many times it runs (D broadcasts, D−1 ring hops, …)
    phase: str = "fwd"  # fwd | bwd | step
    block: str = ""  # attention, mlp, mamba2, mamba1, embedding, logits, model
    what: str = ""
    overlap: str = "none"  # none | gemm (TSP ring / broadcast stream) | attention (SP K/V) | backward (grads)
    line: bool = False  # send_recv to the next rank along a line, not a ring: the last rank sends nothing
    ranks_share: float = 1.0  # the share of the axis's ranks that take part (the pipeline's two ends: 2/pp)
    # An all-to-all of routed copies, `fanout` a token, DeepEP's way (0: NCCL's): a token crosses to a
    # node once, to at most `node_limit` nodes (0: any), and is forwarded to its GPUs inside the node.
    fanout: int = 0
    node_limit: int = 0

    @property
    def share(self) -> float:
        """Sends per rank, averaged over the group: (n − 1)/n along a line; times the ranks taking part."""
        return ((self.group_size - 1) / self.group_size if self.line else 1.0) * self.ranks_share

    @property
    def bytes_per_rank(self) -> float:
        return volume_factor(self.kind, self.group_size) * self.message_bytes * self.count * self.share

    @property
    def message_bytes_per_rank(self) -> float:
        """Buffer bytes a rank hands to collectives, averaged over the group (what the executor counts)."""
        return self.message_bytes * self.count * self.share


@dataclass(frozen=True)
class GroupPlacement:
    """Where a mesh axis's group sits: members per node and nodes spanned."""

    size: int
    per_node: int
    nodes: int


def place_axis(size: int, stride: int, gpus_per_node: int) -> GroupPlacement:
    """A group of `size` ranks spaced `stride` apart (inner axes have stride 1, ranks fill nodes in order)."""
    if size <= 1:
        return GroupPlacement(size, size, 1)
    if stride >= gpus_per_node:
        return GroupPlacement(size, 1, size)
    per_node = max(1, min(size, gpus_per_node // stride))
    return GroupPlacement(size, per_node, max(1, size // per_node))


def tree_all_reduce_s(message_bytes: float, n: int, latency_s: float, bw: float) -> float:
    """NCCL's double binary tree all-reduce (Sanders, Speck, Träff 2009; NCCL 2.4): a reduce up and a
    broadcast down trees of depth ⌈log2 n⌉, pipelined, each byte crossing a rank's link about twice.
    Latency grows with log n instead of n, so it wins for small messages; NCCL picks the faster."""
    depth = math.ceil(math.log2(n))
    return 2 * depth * latency_s + 2 * message_bytes / bw


def collective_time_s(
    kind: str,
    message_bytes: float,
    group: GroupPlacement,
    intra_bw: float,
    intra_lat: float,
    inter_bw: float,
    inter_lat: float,
    fanout: int = 0,
    node_limit: int = 0,
) -> float:
    """α-β time of one collective; bandwidths per direction per rank, in bytes/s (`fanout`,
    `node_limit`: an all-to-all of routed copies sent DeepEP's way, all_to_all_s)."""
    n = group.size
    if n <= 1 or message_bytes <= 0:
        return 0.0
    if kind == "all_to_all" and (group.nodes > 1 or fanout):
        return all_to_all_s(message_bytes, group, intra_bw, intra_lat, inter_bw, inter_lat, fanout, node_limit)
    if group.nodes == 1 or group.per_node == 1:
        lat, bw = (intra_lat, intra_bw) if group.nodes == 1 else (inter_lat, inter_bw)
        factor, steps = _time_factor_and_steps(kind, n)
        ring = steps * lat + factor * message_bytes / bw
        if kind != "all_reduce":
            return ring
        return min(ring, tree_all_reduce_s(message_bytes, n, lat, bw))
    # Hierarchical: inside the node on M, across nodes on M / per_node (each local rank drives its slice).
    local = GroupPlacement(group.per_node, group.per_node, 1)
    remote = GroupPlacement(group.nodes, 1, group.nodes)
    if kind == "all_reduce":
        return (
            collective_time_s("reduce_scatter", message_bytes, local, intra_bw, intra_lat, inter_bw, inter_lat)
            + collective_time_s(
                "all_reduce", message_bytes / group.per_node, remote, intra_bw, intra_lat, inter_bw, inter_lat
            )
            + collective_time_s("all_gather", message_bytes, local, intra_bw, intra_lat, inter_bw, inter_lat)
        )
    if kind in ("all_gather", "reduce_scatter"):
        return collective_time_s(
            kind, message_bytes, local, intra_bw, intra_lat, inter_bw, inter_lat
        ) + collective_time_s(kind, message_bytes / group.per_node, remote, intra_bw, intra_lat, inter_bw, inter_lat)
    # broadcast and send/recv: the slowest hop is the network one.
    factor, steps = _time_factor_and_steps(kind, n)
    return steps * inter_lat + factor * message_bytes / inter_bw


def all_to_all_s(
    message_bytes: float,
    group: GroupPlacement,
    intra_bw: float,
    intra_lat: float,
    inter_bw: float,
    inter_lat: float,
    fanout: int = 0,
    node_limit: int = 0,
) -> float:
    """An all-to-all over a group that spans nodes: a rank's sends to its node's peers, (g − 1)/n of
    the buffer, go over NVLink while its sends to other nodes, (n − g)/n, go over its NIC at the same
    time; the slower path sets the time. Nothing can be combined on the way, so unlike an all-gather
    the bytes leaving a node are not cut by its g ranks.

    DeepEP (`fanout` > 0: the buffer is routed copies, `fanout` a token): a token is sent once to each
    rank and once to each node holding one of its experts (deep_ep get_dispatch_layout). Of `reach`
    nodes (the group's, or `node_limit`) and the R ranks on them, a token's experts hit
    reach·(1 − (1 − 1/reach)^fanout) nodes, (nodes − 1)/nodes of them remote, over RDMA, and
    R·(1 − (1 − 1/R)^fanout) ranks, reached over NVLink (directly, or forwarded by the rank the RDMA
    landed on) but for the share that is the rank itself."""
    n, g, nodes = group.size, group.per_node, group.nodes
    intra = (g - 1) / n * message_bytes
    inter = (n - g) / n * message_bytes
    if fanout:
        tokens = message_bytes / fanout
        reach = min(node_limit or nodes, nodes)
        ranks = min(n, reach * g)
        inter = tokens * reach * (1 - (1 - 1 / reach) ** fanout) * (nodes - 1) / nodes
        intra = tokens * ranks * (1 - (1 - 1 / ranks) ** fanout) * (g - 1) / g
    local = (g - 1) * intra_lat + intra / intra_bw if g > 1 else 0.0
    remote = (nodes - 1) * inter_lat + inter / inter_bw if nodes > 1 else 0.0
    return max(local, remote)

"""The network at scale: ring against double-binary-tree all-reduce over a thousand ranks, hierarchical
collectives across nodes, and a fat tree's oversubscription from the cluster TOML."""

from dataclasses import replace

import pytest

from meshplan.costmodel.collectives import GroupPlacement, collective_time_s, tree_all_reduce_s
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.step import estimate_step
from meshplan.errors import MeshplanError
from meshplan.layout import Layout
from meshplan.models import gpt
from meshplan.topologies.cluster import cluster_from_dict, load_cluster

LAT, BW = 5e-6, 25e9


def test_tree_beats_ring_for_small_messages_at_1024_ranks():
    flat = GroupPlacement(1024, 1, 1024)
    small, big = 1e5, 1e10
    ring_small = 2 * 1023 * LAT + 2 * 1023 / 1024 * small / BW
    # 1,023 ring steps of latency against 2·log2(1024) = 20 tree steps (NCCL's double binary tree).
    assert collective_time_s("all_reduce", small, flat, BW, LAT, BW, LAT) == pytest.approx(
        tree_all_reduce_s(small, 1024, LAT, BW)
    )
    assert tree_all_reduce_s(small, 1024, LAT, BW) < ring_small / 20
    # At 1,024 ranks the ring's 2,046 latency steps outweigh the tree's 2/n more bytes even at 10 GB;
    # on 16 ranks large messages take the ring (2(n − 1)/n of the bytes against the tree's 2).
    big = 1e10
    ring_1024 = 2 * 1023 * LAT + 2 * 1023 / 1024 * big / BW
    assert collective_time_s("all_reduce", big, flat, BW, LAT, BW, LAT) < ring_1024
    ring_16 = 2 * 15 * LAT + 2 * 15 / 16 * big / BW
    assert collective_time_s("all_reduce", big, GroupPlacement(16, 1, 16), BW, LAT, BW, LAT) == pytest.approx(ring_16)


def test_hierarchical_all_gather_by_hand():
    # 8 nodes × 8 GPUs: inside each node on M, across nodes on M/8 (each local rank drives its slice).
    group = GroupPlacement(64, 8, 8)
    m, intra = 8e9, 300e9
    want = (7 * LAT + 7 / 8 * m / intra) + (7 * LAT + 7 / 8 * (m / 8) / BW)
    assert collective_time_s("all_gather", m, group, intra, LAT, BW, LAT) == pytest.approx(want)


def _toml(**inter):
    return {
        "name": "t",
        "gpus_per_node": 8,
        "gpu": {
            "name": "NVIDIA A100-SXM4-80GB",
            "memory_bytes": 85899345920,
            "bf16_tflops": 312.0,
            "hbm_tb_per_s": 2.039,
        },
        "intra_node": {"fabric": "nvswitch", "link_gb_per_s": 300, "latency_us": 3.0},
        "inter_node": {"nics_per_node": 8, "nic_gb_per_s": 25, "latency_us": 5.0, **inter},
    }


def test_oversubscription_slows_groups_that_leave_a_leaf():
    full = cluster_from_dict(_toml(), "full").with_nodes(8)
    half = cluster_from_dict(_toml(nodes_per_leaf=2, oversubscription=2), "2:1").with_nodes(8)
    assert half.inter_node_bandwidth(2) == full.inter_node_bandwidth(2) == 25e9
    assert half.inter_node_bandwidth(8) == pytest.approx(12.5e9)
    model = gpt("g", 4096, 8, 32, 51200, 2048)
    opts = CostOptions(stack="megatron-2021", global_batch=64)  # the gradient all-reduce exposed
    a = estimate_step(model, Layout(dp=8, tp=8), 2048, 1, opts, full)
    b = estimate_step(model, Layout(dp=8, tp=8), 2048, 1, opts, half)
    assert b.step_time_s > a.step_time_s
    assert b.breakdown["gradient_sync_exposed_s"] > 1.5 * a.breakdown["gradient_sync_exposed_s"]


def test_network_keys_are_checked():
    with pytest.raises(MeshplanError, match="unknown key \\[inter_node\\] 'oversubscriptoin'; did you mean"):
        cluster_from_dict(_toml(oversubscriptoin=2), "typo")
    with pytest.raises(MeshplanError, match="oversubscription must be >= 1"):
        cluster_from_dict(_toml(oversubscription=0.5), "bad")
    with pytest.raises(MeshplanError, match="nodes_per_leaf must be a whole number"):
        cluster_from_dict(_toml(nodes_per_leaf=1.5), "bad")


def test_a100_preset_is_the_papers_cluster():
    c = load_cluster("a100-sxm-8", 280)
    assert c.num_gpus == 2240 and c.nics_per_node == 8 and c.nic_link.bandwidth_bytes_per_s == 25e9
    assert c.oversubscription == 1.0 and replace(c, nodes_per_leaf=4).inter_node_bandwidth(280) == 25e9

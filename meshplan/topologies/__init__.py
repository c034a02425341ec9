"""Cluster descriptions (TOML presets and files) and their networkx graphs."""

from meshplan.topologies.cluster import ClusterSpec, build_graph, load_cluster, preset_names

__all__ = ["ClusterSpec", "build_graph", "load_cluster", "preset_names"]

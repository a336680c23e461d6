"""Cluster planner: per-GPU memory and step time of a ZAYA training layout (tools/estimate.py)."""
from megatron_zaya.planner.hardware import CLUSTERS, PEAK_BF16_TFLOPS, ClusterSpec, Efficiency, cluster_from_preset  # noqa: F401
from megatron_zaya.planner.layout import LayoutError, ParallelLayout  # noqa: F401

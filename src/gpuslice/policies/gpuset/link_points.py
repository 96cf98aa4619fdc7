"""Pair scores of go-gpuallocator and HAMi: points per link, summed over a pair's link records.

PCIe record: SYS 10, NODE 20, PHB 30, PXB 40, PIX 50 (same board 60, which our model reads as PIX);
NVLink record: 100 per link, 1 to 18 links. Sources: NVIDIA/go-gpuallocator ``calculateGPUPairScore``
(``gpuallocator/besteffort_policy.go``) and Project-HAMi/HAMi ``pkg/device/nvidia/calculate_score.go``,
identical tables. The one difference is NVSwitch: go-gpuallocator counts only links whose far end is the
peer GPU, so on switch boards its NVLink record is empty (``internal/links/device.go``); HAMi counts switch
links since Project-HAMi/HAMi#2103.
"""

from __future__ import annotations

import numpy as np

from gpuslice.hardware.topology import LinkType, Topology

__all__ = ["PCIE_POINTS", "POINTS_PER_NVLINK", "pair_points"]

PCIE_POINTS: dict[LinkType, int] = {
    LinkType.SYS: 10,
    LinkType.NODE: 20,
    LinkType.PHB: 30,
    LinkType.PXB: 40,
    LinkType.PIX: 50,
}
POINTS_PER_NVLINK = 100


def pair_points(topology: Topology, *, see_nvswitch: bool) -> np.ndarray:
    """n × n integer pair scores (0 on the diagonal); ``see_nvswitch`` False reproduces the blind spot."""
    n = topology.n_gpus
    points = np.zeros((n, n), dtype=np.int64)
    for i in range(n):
        for j in range(n):
            if i != j:
                points[i, j] = PCIE_POINTS[topology.pcie_link(i, j)]
    if see_nvswitch or not topology.nvswitch:
        points += POINTS_PER_NVLINK * topology.nvlinks
    return points

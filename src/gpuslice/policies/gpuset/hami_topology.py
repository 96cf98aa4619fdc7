"""HAMi topology-aware: most-connected set for k GPUs, least-connected GPU for one.

Optimises: for k ≥ 2, the highest sum of pair points over all C(n, k) sets of the free GPUs; for k = 1,
the free GPU with the lowest sum of pair points to the other free GPUs (keeping good pairs free). When
exactly k GPUs are free it takes them all. Ties go to the first set in ascending order.
Pair points: ``link_points``, NVSwitch links counted (Project-HAMi/HAMi#2103).
Source: Project-HAMi/HAMi ``pkg/device/nvidia/calculate_score.go`` (``Fit`` → ``computeBestCombination``
/ ``computeWorstSignleCard``).
Weakness: a sum of points, so one PCIe hop inside an otherwise NVLinked set goes unnoticed; it keeps
nothing back for the next multi-GPU request.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np

from gpuslice.policies.gpuset.base import GpuSetOps, GpuSetView
from gpuslice.policies.gpuset.link_points import pair_points

__all__ = ["HamiTopology"]


class HamiTopology(GpuSetOps):
    name = "hami"
    summary = "HAMi topology-aware: highest pair-point sum; 1 GPU: least connected"

    def pick(self, view: GpuSetView, k: int) -> Sequence[int]:
        free = view.free
        if len(free) == k:
            return free
        points = pair_points(view.topology, see_nvswitch=True)[np.ix_(free, free)]
        if k == 1:
            return (free[int(np.argmin(points.sum(axis=1)))],)  # argmin: first of equals
        index = {g: i for i, g in enumerate(free)}
        return max(
            combinations(free, k),
            key=lambda c: int(np.triu(points[np.ix_([index[g] for g in c], [index[g] for g in c])], 1).sum()),
        )

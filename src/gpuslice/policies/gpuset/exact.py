"""Exact: the best-connected k-set of the free GPUs, found by trying every one; ties keep the best leftovers.

Optimises, in this order (lexicographic):
1. ring bandwidth of the set, higher is better: the slowest link of the best ring through it, what a
   ring all-reduce is bounded by (``Topology.ring_bandwidth``; docs/references.md, "GPU topology");
2. hop cost, lower is better: sum over pairs of the cost model's hops (1 NVLink, 2 NVSwitch, 3 PCIe);
3. NUMA nodes spanned, fewer is better (CPU affinity: the job's host threads stay on one socket);
4. what the GPUs left free can still offer the next request: the sum, over next-request sizes 2, 4 and 8
   that still fit, of the best ring bandwidth a set of that size could get from them;
5. lowest GPU indices (deterministic).
Exact search is cheap at machine scale: at most C(8,4) = 70 candidate sets.
Where it works well: NVLink meshes and PCIe trees, where some sets are much better than others. On
NVSwitch boards every set is equal on 1–2, so NUMA affinity and the leftovers decide.
Weakness: greedy over time; it protects the next request, not a whole future stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np

from gpuslice.hardware.topology import Topology, mask_of
from gpuslice.policies.gpuset.base import GpuSetOps, GpuSetView

__all__ = ["Exact"]

NEXT_REQUEST_SIZES = (2, 4, 8)  # the multi-GPU job sizes the leftovers are judged for
_DIGITS = 9  # bandwidths and hops are compared after rounding, so float noise never breaks a tie


class Exact(GpuSetOps):
    name = "exact"
    summary = "exact search: best ring bandwidth, then fewest hops, then best leftovers (ours)"

    def __init__(self, rng: np.random.Generator | None = None) -> None:
        super().__init__(rng)
        self._leftovers: dict[tuple[Topology, int], float] = {}  # per (machine, free mask); never stale

    def pick(self, view: GpuSetView, k: int) -> Sequence[int]:
        topo = view.topology
        ranked = [(self.cost(topo, c), c) for c in combinations(view.free, k)]
        best_cost = min(cost for cost, _ in ranked)
        tied = [c for cost, c in ranked if cost == best_cost]
        if len(tied) == 1:
            return tied[0]
        # max() keeps the first of equals, and combinations() come in ascending index order
        return max(tied, key=lambda c: self.leftover_value(topo, tuple(g for g in view.free if g not in c)))

    @staticmethod
    def cost(topology: Topology, gpus: tuple[int, ...]) -> tuple[float, float, int]:
        """Communication cost of a set, compared as a tuple: (−ring GB/s, hop cost, NUMA nodes spanned)."""
        ring = -round(topology.ring_bandwidth(gpus), _DIGITS)
        return ring, round(topology.hop_cost(gpus), _DIGITS), _numa_span(topology, gpus)

    def leftover_value(self, topology: Topology, free: tuple[int, ...]) -> float:
        """Sum over next-request sizes that fit in ``free`` of the best ring bandwidth of such a set."""
        key = (topology, mask_of(free))
        if key not in self._leftovers:
            self._leftovers[key] = _leftover_value(topology, free)
        return self._leftovers[key]


def _numa_span(topology: Topology, gpus: tuple[int, ...]) -> int:
    return len({topology.numa[g] for g in gpus})


def _leftover_value(topology: Topology, free: tuple[int, ...]) -> float:
    best = (
        max(topology.ring_bandwidth(s) for s in combinations(free, size))
        for size in NEXT_REQUEST_SIZES
        if size <= len(free)
    )
    return round(sum(best), _DIGITS)

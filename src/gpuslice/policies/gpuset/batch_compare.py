"""What batch assignment is compared with, and the all-reduce model the comparison is made in.

- ``greedy_sets``: one job at a time in the given order, each the one GPU-set choice (``pick_gpu_set``,
  the exact search) over what the jobs before it left free: what every home does without a batch.
- ``round_robin_sets``: topology-blind; a cursor walks the GPU indices in a circle from ``start`` and each
  job takes the next k free GPUs after it (the cursor stays where the last job ended).
- ``ring_allreduce_seconds``: the modelled time of a ring all-reduce of ``size_bytes`` over a set,
  2(k−1)/k · S / B_min, B_min the bottleneck link of the best ring through the set
  (``Topology.ring_bandwidth``; docs/references.md, "ring all-reduce"). A model, not a measurement.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from gpuslice.hardware.topology import Topology
from gpuslice.policies.gpuset.pick import pick_gpu_set

__all__ = ["greedy_sets", "ring_allreduce_seconds", "round_robin_sets"]

GB = 1e9  # bandwidths are GB/s (decimal), as NVIDIA quotes them


def greedy_sets(topology: Topology, free: Collection[int], ks: Sequence[int]) -> list[tuple[int, ...] | None]:
    left = {int(g) for g in free}
    out: list[tuple[int, ...] | None] = []
    for k in ks:
        chosen = pick_gpu_set(topology, left, k)
        out.append(chosen)
        if chosen is not None:
            left -= set(chosen)
    return out


def round_robin_sets(
    topology: Topology, free: Collection[int], ks: Sequence[int], start: int = 0
) -> list[tuple[int, ...] | None]:
    n = topology.n_gpus
    left = {int(g) for g in free}
    cursor = start % n
    out: list[tuple[int, ...] | None] = []
    for k in ks:
        if k > len(left):
            out.append(None)
            continue
        taken: list[int] = []
        while len(taken) < k:
            if cursor in left:
                taken.append(cursor)
            cursor = (cursor + 1) % n
        left -= set(taken)
        out.append(tuple(sorted(taken)))
    return out


def ring_allreduce_seconds(topology: Topology, gpus: Sequence[int], size_bytes: float) -> float:
    """2(k−1)/k · S / B_min in seconds; 0 for one GPU (nothing crosses a link)."""
    k = len(gpus)
    if k < 2:
        return 0.0
    return 2 * (k - 1) / k * size_bytes / (topology.ring_bandwidth(gpus) * GB)

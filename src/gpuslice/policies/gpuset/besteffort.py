"""Besteffort: go-gpuallocator's policy, the NVIDIA device plugin's default GPU-set choice.

Optimises: the best *partition* of all free GPUs into sets of size k (padded with placeholders that never
spread over two sets), by the sum of pair points over every set; then returns that partition's best set.
The first partition found wins ties; a 1-GPU request gets the first free GPU.
Pair points: ``link_points`` with the NVSwitch blind spot (no NVLink record on switch boards).
Source: NVIDIA/go-gpuallocator ``gpuallocator/besteffort_policy.go``, reimplemented from its steps.
Weakness: scores are a sum of link points, not the slowest link, so a set with many NVLinks and one
PCIe hop can beat a uniformly linked one; 1-GPU jobs ignore what they break.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import combinations

import numpy as np

from gpuslice.policies.gpuset.base import GpuSetOps, GpuSetView
from gpuslice.policies.gpuset.link_points import pair_points

__all__ = ["BestEffort"]

_PAD = -1  # a placeholder GPU (go-gpuallocator's nil device)


def partitions(devices: tuple[int, ...], size: int, padding: int) -> Iterator[list[tuple[int, ...]]]:
    """Every split of ``devices`` into sets of ``size``, in go-gpuallocator's order (its Allocate, step 3).

    Each set holds the lowest remaining device first, so no partition appears twice; a set with some
    but not all of the ``padding`` placeholders is skipped.
    """
    if len(devices) == size:
        yield [devices]
        return
    first, rest = devices[0], devices[1:]
    for tail in combinations(rest, size - 1):
        chosen = (first, *tail)
        pads = chosen.count(_PAD)
        if pads not in (0, padding):
            continue
        remaining = tuple(d for d in rest if d not in tail)
        for more in partitions(remaining, size, padding):
            yield [chosen, *more]


class BestEffort(GpuSetOps):
    name = "besteffort"
    summary = "go-gpuallocator besteffort: best partition of the free GPUs, then its best set"

    def pick(self, view: GpuSetView, k: int) -> Sequence[int]:
        if k == 1:
            return view.free[:1]
        points = pair_points(view.topology, see_nvswitch=False)

        def set_score(gpus: tuple[int, ...]) -> int:
            real = [g for g in gpus if g != _PAD]
            return int(np.triu(points[np.ix_(real, real)], 1).sum())

        padding = -len(view.free) % k
        devices = view.free + (_PAD,) * padding  # placeholders sort last, as nils are appended
        best: list[tuple[int, ...]] | None = None
        best_score = 0
        for candidate in partitions(devices, k, padding):
            score = sum(set_score(s) for s in candidate)
            if best is None or score > best_score:
                best, best_score = candidate, score
        assert best is not None  # len(free) >= k, so at least one partition exists
        real_sets = [s for s in best if _PAD not in s]
        return max(real_sets, key=set_score)  # max() keeps the first of equals, as the Go loop does

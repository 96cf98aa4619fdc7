"""Random: k free GPUs uniformly at random. Optimises nothing; the floor the other policies must beat."""

from __future__ import annotations

from collections.abc import Sequence

from gpuslice.policies.gpuset.base import GpuSetOps, GpuSetView

__all__ = ["RandomSet"]


class RandomSet(GpuSetOps):
    name = "random"
    summary = "k free GPUs uniformly at random (floor)"

    def pick(self, view: GpuSetView, k: int) -> Sequence[int]:
        return tuple(int(g) for g in self.rng.choice(view.free, size=k, replace=False))

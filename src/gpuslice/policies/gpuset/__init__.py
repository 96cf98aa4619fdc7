"""GPU-set policies: which k GPUs of one machine a multi-GPU job gets. One per file, one registry."""

from __future__ import annotations

import numpy as np

from gpuslice.errors import UnknownPolicy
from gpuslice.policies.gpuset.base import (
    GpuSetChoice,
    GpuSetOps,
    GpuSetUnavailable,
    GpuSetView,
    choose_gpu_set,
)
from gpuslice.policies.gpuset.besteffort import BestEffort
from gpuslice.policies.gpuset.exact import Exact
from gpuslice.policies.gpuset.hami_topology import HamiTopology
from gpuslice.policies.gpuset.random import RandomSet

__all__ = [
    "GPUSET",
    "GpuSetChoice",
    "GpuSetOps",
    "GpuSetUnavailable",
    "GpuSetView",
    "choose_gpu_set",
    "gpuset_policy",
    "make_gpuset_policy",
]

GPUSET: dict[str, type[GpuSetOps]] = {p.name: p for p in (Exact, BestEffort, HamiTopology, RandomSet)}


def gpuset_policy(name: str) -> type[GpuSetOps]:
    """The GPU-set policy class registered as ``name``; UnknownPolicy lists the known names otherwise."""
    try:
        return GPUSET[name]
    except KeyError:
        raise UnknownPolicy(f"{name!r} is not a GPU-set policy; known: {', '.join(sorted(GPUSET))}") from None


def make_gpuset_policy(name: str, seed: int = 0) -> GpuSetOps:
    return gpuset_policy(name)(np.random.default_rng(seed))

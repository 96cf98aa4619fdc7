"""The GPU-set ops table: which k GPUs of one machine a multi-GPU job gets, and the mechanism around it.

Lifecycle of one request for k GPUs on one machine:

```text
view   = GpuSetView(topology, free)                 # read-only: the wiring and the free GPUs, ascending
advice = policy.pick(view, k)                        # any k GPU indices; a policy may be wrong
choice = choose_gpu_set(policy, topology, free, k)   # advice that is not k distinct free GPUs, or that
                                                     # raised, is replaced by the default and counted
```

A policy only advises (DESIGN.md "policy advises, mechanism decides"): a broken one costs bandwidth,
never correctness. The default pick is the k lowest free indices, what a plain device plugin does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from gpuslice.errors import UserError
from gpuslice.hardware.topology import Topology

__all__ = [
    "GpuSetChoice",
    "GpuSetOps",
    "GpuSetUnavailable",
    "GpuSetView",
    "check_gpu_set_request",
    "choose_gpu_set",
]


class GpuSetUnavailable(UserError):
    """A request asks for more GPUs than are free on the machine, or names a GPU it does not have."""


@dataclass(frozen=True, slots=True)
class GpuSetView:
    """What a GPU-set policy may read: the machine's wiring and its free GPUs in ascending order."""

    topology: Topology
    free: tuple[int, ...]


class GpuSetOps:
    """Base of every GPU-set policy. Only ``name`` is required; ``pick`` defaults to the lowest free."""

    name: ClassVar[str] = "lowest"
    summary: ClassVar[str] = "the k lowest-numbered free GPUs"

    def __init__(self, rng: np.random.Generator | None = None) -> None:
        self.rng = rng if rng is not None else np.random.default_rng(0)

    def pick(self, view: GpuSetView, k: int) -> Sequence[int]:
        """Called once per request, with 1 ≤ k ≤ len(view.free); returns k GPU indices (advice)."""
        return view.free[:k]


@dataclass(frozen=True, slots=True)
class GpuSetChoice:
    """The GPUs a request got, how well they are connected, and whether the policy's advice was used."""

    gpus: tuple[int, ...]
    ring_bandwidth_gbps: float  # inf for one GPU
    hop_cost: float
    policy: str
    fallback: str | None = None  # why the policy's advice was replaced, or None


def check_gpu_set_request(topology: Topology, free: Sequence[int], k: int) -> tuple[int, ...]:
    """The free GPUs, ascending, when k of them can be asked for; GpuSetUnavailable saying why not."""
    free_sorted = tuple(sorted({int(g) for g in free}))
    bad = [g for g in free_sorted if not 0 <= g < topology.n_gpus]
    if bad:
        raise GpuSetUnavailable(
            f"GPU {bad[0]} does not exist on {topology.name} (GPUs 0–{topology.n_gpus - 1})"
        )
    if not free_sorted:
        raise GpuSetUnavailable(f"every GPU of {topology.name} is busy: free some GPUs first")
    if not 1 <= k <= len(free_sorted):
        raise GpuSetUnavailable(
            f"asked for {k} GPUs on {topology.name} but {len(free_sorted)} are free "
            f"({', '.join(map(str, free_sorted)) or 'none'}); ask for 1–{len(free_sorted)} or free some GPUs"
        )
    return free_sorted


def choose_gpu_set(policy: GpuSetOps, topology: Topology, free: Sequence[int], k: int) -> GpuSetChoice:
    """Ask ``policy`` for k of the ``free`` GPUs and validate its answer; GpuSetUnavailable if impossible."""
    free_sorted = check_gpu_set_request(topology, free, k)
    fallback = None
    try:
        advice = tuple(int(g) for g in policy.pick(GpuSetView(topology, free_sorted), k))
    except Exception as err:  # a crashing policy must not take the mechanism down (STYLE.md habit 5)
        advice, fallback = (), f"pick raised {type(err).__name__}"
    if fallback is None and (len(set(advice)) != k or not set(advice) <= set(free_sorted)):
        fallback = f"pick returned {advice}, not {k} distinct free GPUs"
    gpus = tuple(sorted(advice)) if fallback is None else free_sorted[:k]
    return GpuSetChoice(
        gpus=gpus,
        ring_bandwidth_gbps=topology.ring_bandwidth(gpus),
        hop_cost=topology.hop_cost(gpus),
        policy=policy.name,
        fallback=fallback,
    )

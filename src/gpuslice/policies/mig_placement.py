"""MIG placement: where on one GPU a new GPU instance of a given profile should start.

The family has one hook, ``choose(layout, profile) -> start | None``; the mechanism (the planner,
``scheduler/mig_planner.py``) only asks among starts that are valid now (``layout.placements``) and
validates the answer with ``MigLayout.with_instance``, so a policy can make a poor choice, never an
overlapping one. ``None`` means "no valid start".

```text
request -> candidate profiles (smallest first) -> for each: policy.choose(layout, profile)
        -> first candidate with a start -> layout.with_instance(...) -> nvidia-smi mig -cgi ID:START -C
```

Policies, smallest first:

- ``lowest-free``: the lowest valid start. The ops-table default; what ``-cgi`` without a placement
  tends to do, and the easiest to read.
- ``first-free``: HAMi's dynamic-MIG placement (HAMi ``pkg/device/nvidia/mig_topology.go``): the first
  NVML placement that does not overlap, trying the highest start first for ``1g.*`` and ``3g.*`` profiles
  and the lowest first for the others.
- ``keep-largest``: among valid starts, the one that leaves the most room for the largest profiles,
  compared lexicographically from the largest shape down; ties go to the highest start. Packing small
  instances from one end keeps the 4g and 3g slots open (NVIDIA *Multi-Instance GPU User Guide*,
  placement table: a 1g at start 3 or 4 already blocks every 3g and the 4g). The one-machine scheduler
  uses it.

A policy's answer is checked once, in ``checked_start``: a start that is not valid now, or an exception,
is replaced by the default's answer (the lowest valid start) and reported, never raised.
"""

from __future__ import annotations

from functools import cache
from typing import ClassVar

from gpuslice.advice import ask
from gpuslice.hardware.mig import MigGpu, MigLayout, MigProfile
from gpuslice.registry import Registry

__all__ = [
    "DEFAULT_MIG_PLACEMENT",
    "MIG_PLACEMENT",
    "FirstFree",
    "KeepLargestPlaceable",
    "LowestFree",
    "MigPlacementOps",
    "checked_start",
    "headroom",
    "mig_placement_policy",
]


class MigPlacementOps:
    """Base of every MIG placement policy; only ``name`` is required."""

    name: ClassVar[str] = "lowest-free"
    summary: ClassVar[str] = "lowest valid start (what any policy falls back to)"

    def choose(self, layout: MigLayout, profile: MigProfile) -> int | None:
        """A start for ``profile`` on ``layout``, or None when none is valid.

        Runs once per candidate profile of a request. Default: the lowest valid start.
        """
        starts = layout.placements(profile)
        return starts[0] if starts else None


class LowestFree(MigPlacementOps):
    """The default, named: lowest valid start."""


class FirstFree(MigPlacementOps):
    """HAMi's first-free placement (dynamic MIG, HAMi v2.10): highest start first for 1g.* and 3g.*."""

    name = "first-free"
    summary = "HAMi dynamic MIG: first non-overlapping placement; 1g/3g from the top, others from 0"

    def choose(self, layout: MigLayout, profile: MigProfile) -> int | None:
        starts = layout.placements(profile)
        if not starts:
            return None
        from_top = profile.name.startswith(("1g.", "3g."))
        return starts[-1] if from_top else starts[0]


@cache
def _shapes(gpu: MigGpu) -> tuple[MigProfile, ...]:
    """The profiles that measure headroom, largest first; ``+me`` shares 1g's geometry, so it is left out."""
    shapes = [p for p in gpu.profiles if not p.media_extensions]
    return tuple(sorted(shapes, key=lambda p: (p.memory_slices, p.compute_slices), reverse=True))


@cache
def _headroom_of_mask(gpu: MigGpu, mask: int) -> tuple[int, ...]:
    # Starts of one profile never overlap each other (they are aligned to the profile's size in the MIG
    # User Guide's placement table), so the
    # number of free starts is how many instances of that profile could still be created together.
    return tuple(sum(1 for s in p.starts if not mask & p.mask_at(s)) for p in _shapes(gpu))


def headroom(layout: MigLayout) -> tuple[int, ...]:
    """How many instances of each shape, largest first (7g, 4g, 3g, 2g, 1g 2×mem, 1g), still fit."""
    return _headroom_of_mask(layout.gpu, layout.mask)


class KeepLargestPlaceable(MigPlacementOps):
    """Keep the largest profiles placeable: maximise what they can still get; ties to the highest start.

    Score of a start s = ``headroom`` of the layout after placing at s, compared lexicographically (one
    more 3g slot beats any number of 1g slots). Known weakness: it does not know the coming requests;
    a stream of only small profiles would do as well with any packing from one end.
    """

    name = "keep-largest"
    summary = "keep the largest profiles placeable (lexicographic headroom, ties to the highest start)"

    def choose(self, layout: MigLayout, profile: MigProfile) -> int | None:
        starts = layout.placements(profile)
        if not starts:
            return None
        mask = layout.mask
        return max(starts, key=lambda s: (_headroom_of_mask(layout.gpu, mask | profile.mask_at(s)), s))


MIG_PLACEMENT: Registry[MigPlacementOps] = Registry(
    "MIG placement", (KeepLargestPlaceable, FirstFree, LowestFree)
)
# The MIG placement every home uses unless told otherwise (serve, the extender, ``gpuslice mig plan``).
DEFAULT_MIG_PLACEMENT = KeepLargestPlaceable.name


def mig_placement_policy(name: str) -> type[MigPlacementOps]:
    """The MIG placement policy class registered as ``name``; UnknownPolicy lists the known ones."""
    return MIG_PLACEMENT.lookup(name)


def checked_start(
    policy: MigPlacementOps, layout: MigLayout, profile: MigProfile, existing: frozenset[int] | None = None
) -> tuple[int | None, str | None]:
    """The policy's start for ``profile`` if it is valid now, else the default's; and why it fell back.

    The advice check of the MIG family (``gpuslice.advice.ask``): an exception, or an answer that is not
    one of ``layout.placements(profile)`` (None, "no start", is always an answer a policy may give),
    falls back to the lowest valid start. The reason ("exception" or "invalid") is returned for the
    caller to count; None when the policy's own answer is used. ``existing``: where instances cannot be
    created (static MIG, Kubernetes), the starts of the existing free instances of ``profile``; only
    those are valid."""
    starts = layout.placements(profile)
    if existing is not None:
        starts = tuple(s for s in starts if s in existing)
    advice = ask(
        lambda: policy.choose(layout, profile),
        lambda start: start is None or start in starts,
        lambda: starts[0] if starts else None,
    )
    return advice.value, advice.fallback

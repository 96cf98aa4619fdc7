"""A pod's slices on one node: one per asking app container, held together or not at all.

```text
hold(cache, built, node, ask)   each app container's slice in spec order (the first: the pod's request):
                                a MIG instance by the one MIG choice, or GPUs by the placer
                                (``Placer.pick_gpus`` among ``open_slots``), reserved in the ledger;
                                one that does not fit gives back those held before it
fits(cache, built, node, ask)   the same as a what-if: held, then given back (a pod where several
                                containers ask; one where a single one asks is judged by the verdicts)
fits_without(..., gone)         preemption's what-if: ``fits`` with the slices of the pods ``gone`` given
                                back first and held again after (the ledger's columns as before)
inside(ask, first)              the slices of the init containers that run inside the first slice: its
                                first GPUs, their own memory and compute
```

Every function runs with ``cache.lock`` held by the caller, and ``hold`` under the node's bind lock too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuslice.errors import LedgerError
from gpuslice.k8s.annotations import PodGpuRequest
from gpuslice.k8s.decision import ContainerDecision, MigChoice
from gpuslice.k8s.extender.cluster import MIG_POD_REQUEST, BoundPod, ClusterCache, LedgerBuild, open_slots
from gpuslice.ledger.placement import Placement, Refusal
from gpuslice.scheduler.mig_choice import choose_mig_instance

__all__ = ["NO_GPUS", "HeldSlices", "fits", "fits_without", "hold", "inside"]

NO_GPUS = "no GPU set fits"  # the placer found no GPUs for a container's share or whole GPUs


@dataclass(frozen=True, slots=True)
class HeldSlices:
    """The app containers' slices, in spec order, and the ledger placements that hold them."""

    slices: tuple[ContainerDecision, ...]
    placements: tuple[Placement, ...]


def hold(cache: ClusterCache, built: LedgerBuild, node: int, ask: PodGpuRequest) -> HeldSlices | str:
    """Reserve every app container's slice of ``ask`` on ``node``; why not (nothing held then)."""
    slices: list[ContainerDecision] = []
    placements: list[Placement] = []
    for one in ask.containers:
        held = _hold_one(cache, built, node, one)
        if isinstance(held, str):
            for placement in placements:
                built.ledger.release(placement)
            where = f"container {one.container!r}: " if ask.multi else ""
            return f"{where}{held}"
        slices.append(held[0])
        placements.append(held[1])
    return HeldSlices(tuple(slices), tuple(placements))


def fits(cache: ClusterCache, built: LedgerBuild, node: int, ask: PodGpuRequest) -> bool:
    """Would every app container's slice of ``ask`` fit on ``node`` together? Nothing stays held."""
    held = hold(cache, built, node, ask)
    if isinstance(held, str):
        return False
    for placement in held.placements:
        built.ledger.release(placement)
    return True


def fits_without(
    cache: ClusterCache, built: LedgerBuild, node: int, ask: PodGpuRequest, gone: Sequence[BoundPod]
) -> bool:
    """Would every app container's slice of ``ask`` fit on ``node`` together once the pods ``gone`` (all
    held in ``built``) are evicted? Their slices are given back for the what-if and held again after,
    on the same GPUs (MIG: the same instances), as new placements in their ``BoundPod``: every column
    of the ledger ends as it began. Each slice is placed by ``hold`` itself, so a victim set is good
    only if the GPUs it frees take the pod's slices one after another, not each slice alone."""
    for bound in gone:
        for placement in bound.placements:
            built.ledger.release(placement)
    try:
        return fits(cache, built, node, ask)
    finally:
        for bound in gone:
            _hold_again(built, bound)


def _hold_again(built: LedgerBuild, bound: BoundPod) -> None:
    """Hold ``bound``'s slices again exactly where they were. Only what was given back a moment ago is
    taken, so a refusal is a broken invariant."""
    again: list[Placement] = []
    for placement in bound.placements:
        if placement.mig is not None:
            mig = placement.mig
            result = built.ledger.reserve_mig(placement.node, mig.gpu, mig.instance, placement.request)
        else:
            result = built.ledger.reserve(placement.node, placement.gpus, placement.request)
        if isinstance(result, Refusal):
            raise LedgerError(f"{bound.namespace}/{bound.name}: a slice given back for a what-if: {result}")
        again.append(result)
    if again:
        bound.placement, bound.extra = again[0], tuple(again[1:])


def inside(ask: PodGpuRequest, first: ContainerDecision) -> tuple[ContainerDecision, ...]:
    """The slices of the init containers of ``ask`` other than the first slice's owner: each on the
    first GPUs of ``first`` (as many as it asks for; MIG: the same instance), with its own limits."""
    out = []
    for one in ask.init:
        if one.mig_profile:
            out.append(ContainerDecision(one.container, first.gpu_indices, first.gpu_uuids, 0, 100, first.mig,
                                         inside=True))  # fmt: skip
            continue
        out.append(ContainerDecision(
            one.container, first.gpu_indices[: one.gpus], first.gpu_uuids[: one.gpus], one.memory_mib,
            one.slice_cores_percent, inside=True,
        ))  # fmt: skip
    return tuple(out)


def _hold_one(
    cache: ClusterCache, built: LedgerBuild, node: int, one: PodGpuRequest
) -> tuple[ContainerDecision, Placement] | str:
    inv = built.inventories[node]
    if one.mig_profile:  # the one MIG choice, as serve's: which existing free instance of the node
        candidates = cache.mig_candidates(built, node, one.mig_profile)
        chosen = choose_mig_instance(candidates, fallbacks=cache.mig_fallbacks)
        if chosen is None:
            return f"no free MIG instance of {one.mig_profile}"
        g, instance = chosen[0].key[1], chosen[1]  # type: ignore[index]
        held = built.ledger.reserve_mig(node, g, instance, MIG_POD_REQUEST)
        if isinstance(held, Refusal):
            return str(held)
        gpu = next(x for x in inv.gpus if x.index == g)
        slot = next(s for s in gpu.mig if s.start == instance.start and s.profile == one.mig_profile)
        mig = MigChoice(gpu.index, slot.profile, slot.start, slot.uuid)
        return ContainerDecision(one.container, (gpu.index,), (gpu.uuid,), 0, 100, mig), held
    req = one.to_request()
    usable = open_slots(built, node, built.ledger.view.gpu_tasks[node])
    gpus = cache.placer(built, one).pick_gpus(req, node, usable, built.topologies[node])
    if gpus is None:
        return NO_GPUS
    result = built.ledger.reserve(node, gpus, req)
    if isinstance(result, Refusal):
        return str(result)
    uuids = {g.index: g.uuid for g in inv.gpus}
    slice_ = ContainerDecision(
        one.container, gpus, tuple(uuids.get(g, "") for g in gpus), one.memory_mib, one.slice_cores_percent
    )
    return slice_, result

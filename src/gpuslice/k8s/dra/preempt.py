"""Preemption for DRA pods, which kube-scheduler does not do for DRA resources.

When gpuslice's allocator finds no room for a gated pod's claim, it asks, per node, which claims held
by lower-priority pods would have to go: the claims there become ``Victim``s (their GPUs, cores as
milli-GPU, memory; the priority of their highest pod), the node's free GPUs a ``Capacity``, and the
same fit rule and victim search the node scheduler uses (``scheduler.node_fit.fits``,
``scheduler.preemption``) answer. The node whose cheapest victim set is cheapest wins; its victims'
pods are deleted (their claims are freed by the resource claim controller when the pods are gone) and
the pod waits for the room.

```text
holders on node (priority < pod's) -> Victim(job_id=claim uid, Holding(gpus, milli, memory), priority)
free GPUs of node                  -> Capacity(free milli, free memory)
victims_for(...)                   -> scheduler.preemption.choose_victims  (the one search)
```
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuslice.scheduler.node_fit import Capacity, Demand, DemandKind, Holding, fits
from gpuslice.scheduler.preemption import Victim, choose_victims, victim_set_cost
from gpuslice.workload.request import MILLI_PER_GPU, Request

__all__ = ["Holder", "PreemptionPlan", "plan_preemption", "victims_for"]


@dataclass(frozen=True, slots=True)
class Holder:
    """An allocated claim on a node of the inventory and the pods that use it."""

    claim_uid: str
    node: int
    gpus: tuple[int, ...]
    milli: int
    memory_bytes: int
    pods: tuple[tuple[str, str, str], ...]  # (namespace, name, uid)
    priority: int  # the highest of its pods'


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    node: int
    victims: tuple[Holder, ...]


def victims_for(
    candidates: Sequence[Victim], capacity: Capacity, fits_on: Callable[[Capacity], bool], now: float
) -> tuple[Victim, ...] | None:
    """The preemption search every home uses; the one place to re-point when that search moves."""
    return choose_victims(candidates, capacity, fits_on, now)


def _demand(req: Request, gpu_count: int) -> Demand:
    eligible = tuple(range(gpu_count))
    if req.num_gpu == 1 and req.gpu_milli < MILLI_PER_GPU:
        return Demand(DemandKind.SHARE, 1, req.gpu_milli, req.gpu_memory_bytes, eligible)
    return Demand(DemandKind.WHOLE, req.num_gpu, MILLI_PER_GPU, 0, eligible)


def plan_preemption(
    req: Request,
    priority: int,
    holders: Sequence[Holder],
    free: Callable[[int], tuple[list[int], list[int], list[int]]],
    nodes: Sequence[int],
) -> PreemptionPlan | None:
    """The cheapest way to make room for ``req`` (a pod of ``priority``) on one of ``nodes``, or None.

    ``free(node)`` gives that node's (free milli, free memory, total memory) per GPU. Only holders whose
    pods all have a lower priority may be victims."""
    best: tuple[tuple[object, ...], PreemptionPlan] | None = None
    for node in nodes:
        lower = [h for h in holders if h.node == node and h.priority < priority]
        if not lower:
            continue
        free_milli, free_memory, total = free(node)
        capacity = Capacity(free_milli, free_memory, [None] * len(total), [0] * len(total), total)
        demand = _demand(req, len(total))
        by_uid = {h.claim_uid: h for h in lower}
        candidates = [
            Victim(h.claim_uid, Holding(h.gpus, h.milli, h.memory_bytes), h.priority, 0.0) for h in lower
        ]
        chosen = victims_for(candidates, capacity, lambda cap, d=demand: fits(d, cap, None), now=0.0)
        if chosen is None:
            continue
        cost = victim_set_cost(chosen, 0.0)
        plan = PreemptionPlan(node, tuple(by_uid[v.job_id] for v in chosen))
        if best is None or cost < best[0]:
            best = (cost, plan)
    return best[1] if best is not None else None

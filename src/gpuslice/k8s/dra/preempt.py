"""Preemption for DRA pods, which kube-scheduler does not do for DRA resources.

When gpuslice's allocator finds no room for a gated pod's claims, it asks, per node, which claims held
by lower-priority pods would have to go: the claims there become ``Victim``s (their GPUs, cores as
milli-GPU, memory; the priority of their highest pod) and the one preemption search every home uses
(``scheduler.preemption.find_preemption``) answers with the allocator's own what-if: the victims'
claims given back in its ledger, all of the pod's claims held together as it will place them, then
everything undone (``Inventory.preemption``). Only holders whose pods all have a lower priority are
victims, and the node whose cheapest victim set is cheapest wins; its victims' pods are deleted (their
claims are freed by the resource claim controller when the pods are gone) and the pod waits for the
room.

```text
holders on every node -> Victim(job_id=claim uid, priority, node, holding=its placement: gpus, milli,
                         memory); what it frees counts as its GPU-equivalent (workload/equivalent.py)
fits_without(node, victims) -> the allocator's what-if on its ledger (all the pod's claims together)
find_preemption(...)  -> the node and the cheapest set of victims there
```
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuslice.policies.queue.base import JobRef
from gpuslice.scheduler.node_fit import Holding, gpus_equivalent
from gpuslice.scheduler.preemption import Victim, find_preemption
from gpuslice.workload.request import Request

__all__ = ["Holder", "PreemptionPlan", "plan_preemption"]


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


def _holding(h: Holder) -> Holding:
    """What a claim holds, with the ledger request its placement takes (cores as milli on each GPU)."""
    request = Request(cpu_milli=0, num_gpu=len(h.gpus), gpu_milli=h.milli, gpu_memory_bytes=h.memory_bytes)
    return Holding(h.gpus, h.milli, h.memory_bytes, request=request)


def plan_preemption(
    priority: int,
    holders: Sequence[Holder],
    free: Callable[[int], tuple[list[int], list[int], list[int]]],
    nodes: Sequence[int],
    fits_without: Callable[[int, Sequence[Holder]], bool],
) -> PreemptionPlan | None:
    """The cheapest way to make room for a pod of ``priority`` on one of ``nodes``, or None.

    ``free(node)`` gives that node's (free milli, free memory, total memory) per GPU, the total to
    weigh what a victim frees; ``fits_without(node, victims)`` whether the pod fits once they are gone.
    Only holders whose pods all have a lower priority may be victims."""
    wanted = set(nodes)
    by_uid = {h.claim_uid: h for h in holders if h.node in wanted}
    total = {node: free(node)[2] for node in {h.node for h in by_uid.values()}}  # GPU memory, per GPU
    running = [
        Victim(h.claim_uid, h.priority, 0.0, gpus_equivalent(hold, total[h.node][h.gpus[0]] if h.gpus else 0),
               node=h.node, holding=hold.placement)
        for h in by_uid.values()
        for hold in (_holding(h),)
    ]  # fmt: skip

    def judged(node: object, victims: tuple[Victim, ...]) -> bool:
        return fits_without(int(node), [by_uid[v.job_id] for v in victims])

    plan = find_preemption(JobRef("", priority), running, judged, now=0.0)
    if plan is None:
        return None
    return PreemptionPlan(int(plan.node), tuple(by_uid[v.job_id] for v in plan.victims))

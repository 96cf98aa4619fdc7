"""Preemption for DRA pods, which kube-scheduler does not do for DRA resources.

When gpuslice's allocator finds no room for a gated pod's claim, it asks, per node, which claims held
by lower-priority pods would have to go: the claims there become ``Victim``s (their GPUs, cores as
milli-GPU, memory; the priority of their highest pod), the node's free GPUs a ledger row, and the
same fit rule and the one preemption search every home uses (``scheduler.node_fit.fits``,
``scheduler.preemption.find_preemption``) answer: only holders whose pods all have a lower priority are
victims, and the node whose cheapest victim set is cheapest wins; its victims'
pods are deleted (their claims are freed by the resource claim controller when the pods are gone) and
the pod waits for the room.

```text
holders on every node -> Victim(job_id=claim uid, priority, node, holding=its placement: gpus, milli,
                         memory); what it frees counts as its GPU-equivalent (workload/equivalent.py)
free GPUs of a node   -> NodeRow(free milli, free memory), the victims' placements given back in the
                         what-if (``NodeRow.given``, the ledger's arithmetic)
find_preemption(...)  -> the node and the cheapest set of victims there
```
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuslice.ledger.whatif import NodeRow
from gpuslice.policies.queue.base import JobRef
from gpuslice.scheduler.node_fit import Demand, DemandKind, Holding, MachineWhatIf, fits, gpus_equivalent
from gpuslice.scheduler.preemption import Victim, find_preemption
from gpuslice.workload.request import MILLI_PER_GPU, Request

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


def _demand(req: Request, gpu_count: int) -> Demand:
    eligible = tuple(range(gpu_count))
    if req.num_gpu == 1 and req.gpu_milli < MILLI_PER_GPU:
        share = Request(
            cpu_milli=0, num_gpu=1, gpu_milli=req.gpu_milli, gpu_memory_bytes=req.gpu_memory_bytes
        )
        return Demand(DemandKind.SHARE, 1, share.gpu_milli, share.gpu_memory_bytes, eligible, request=share)
    whole = Request(cpu_milli=0, num_gpu=req.num_gpu, gpu_milli=MILLI_PER_GPU)
    return Demand(DemandKind.WHOLE, req.num_gpu, MILLI_PER_GPU, 0, eligible, request=whole)


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
    wanted = set(nodes)
    by_uid = {h.claim_uid: h for h in holders if h.node in wanted}
    total = {node: free(node)[2] for node in {h.node for h in by_uid.values()}}  # GPU memory, per GPU
    running = [
        Victim(h.claim_uid, h.priority, 0.0, gpus_equivalent(hold, total[h.node][h.gpus[0]] if h.gpus else 0),
               node=h.node, holding=hold.placement)
        for h in by_uid.values()
        for hold in (_holding(h),)
    ]  # fmt: skip

    def fits_without(node: object, victims: tuple[Victim, ...]) -> bool:
        free_milli, free_memory, total = free(int(node))
        row = NodeRow(0, 0, tuple(free_milli), tuple(free_memory), tuple(total))  # CPU is kube-scheduler's
        trial = MachineWhatIf(row.given(v.holding for v in victims))
        return fits(_demand(req, len(total)), trial, None)

    plan = find_preemption(JobRef("", priority), running, fits_without, now=0.0)
    if plan is None:
        return None
    return PreemptionPlan(int(plan.node), tuple(by_uid[v.job_id] for v in plan.victims))

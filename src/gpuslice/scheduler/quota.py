"""Tenant quotas on one machine: how much of it a job holds, the least it could hold wherever it goes,
and whether a tenant has room for it.

GPUs are counted as ``workload.equivalent.gpu_equivalent``: what a slice denies others (a share the larger
of its compute and memory fractions of its GPU, a MIG instance its compute slices / 7). A waiting job has
no GPU yet, so which GPU's memory size counts depends on the question:

```text
least_use(demand)   the largest GPU it may use (smallest fraction): "could it ever fit?" Refusing at
                    submit, and the quota gate before placement, must not turn away a job that fits
                    somewhere; the start then counts the GPU chosen (exact, checked again).
most_gpus(demand)   the smallest GPU it may use (largest fraction): "may it preempt?" A job evicts others
                    only when its quota has room for it wherever the freed GPU is, so it never evicts a
                    job and then waits on its quota.
held_gpus(holding)  the GPU it sits on (running jobs: quota usage, fair share, victims' cost, the API).
```
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from gpuslice.errors import InvalidRequest
from gpuslice.hardware.machine import Machine
from gpuslice.ledger.placement import Refusal, RefusalCode, Unit
from gpuslice.scheduler.node_fit import Demand, DemandKind, Holding, gpus_equivalent
from gpuslice.scheduler.reasons import PendingReason
from gpuslice.units import format_size
from gpuslice.workload.equivalent import gpu_equivalent
from gpuslice.workload.request import MILLI_PER_GPU

__all__ = [
    "QuotaNeverFits",
    "QuotaShort",
    "TenantQuota",
    "check_fits_quota",
    "held_gpus",
    "least_use",
    "memory_of",
    "memory_on",
    "most_gpus",
    "never_fits",
    "never_reason",
    "quota_reason",
    "tenant_usage",
]


class QuotaNeverFits(InvalidRequest):
    """A job needs more than its tenant's whole quota: it could never start, even on an idle machine.
    HTTP 422, like a body the schema refuses: the request is well formed but beyond a documented limit."""

    http_status: ClassVar[int] = 422


@dataclass(frozen=True)
class TenantQuota:
    """A tenant's fair-share weight and limits; None means no limit. GPUs count shares as fractions."""

    name: str
    weight: float = 1.0
    max_gpus: float | None = None
    max_gpu_memory_bytes: int | None = None


def memory_on(machine: Machine, h: Holding, g: int) -> int:
    """GPU memory ``h`` holds on GPU ``g``: a MIG instance its slices, a whole GPU all of it."""
    if h.mig is not None:
        return h.mig.profile.memory_bytes
    if h.milli >= MILLI_PER_GPU:
        return machine.gpus[g].memory_bytes
    return h.memory_bytes


def memory_of(machine: Machine, h: Holding) -> int:
    return sum(memory_on(machine, h, g) for g in h.gpus)


def held_gpus(machine: Machine, h: Holding) -> float:
    """GPUs a running job's holding counts as: its share measured against the GPU it sits on."""
    return gpus_equivalent(h, machine.gpus[h.gpus[0]].memory_bytes if h.gpus else 0)


def _share_gpus(machine: Machine, demand: Demand, pick: type[min] | type[max]) -> float:
    """A waiting share's GPUs on the eligible GPU of ``pick`` (max: largest) memory."""
    size = pick(machine.gpus[g].memory_bytes for g in demand.eligible)
    return gpu_equivalent(1, demand.milli, demand.memory_bytes, size)


def least_use(machine: Machine, demand: Demand) -> tuple[float, int]:
    """The fewest GPUs and least GPU memory the job can hold, wherever it goes (for quotas)."""
    if demand.kind is DemandKind.NONE:
        return 0.0, 0
    if demand.kind is DemandKind.MIG:
        profiles = [p for _, ps in demand.mig_options for p in ps]
        slices = min(p.compute_slices for p in profiles)
        return gpu_equivalent(1, mig_slices=slices), min(p.memory_bytes for p in profiles)
    if demand.kind is DemandKind.SHARE:
        return _share_gpus(machine, demand, max), demand.memory_bytes
    smallest = sorted(machine.gpus[g].memory_bytes for g in demand.eligible)
    return float(demand.count), sum(smallest[: demand.count])


def most_gpus(machine: Machine, demand: Demand) -> float:
    """The most GPUs the job can count as, wherever it goes (may it preempt: module docstring)."""
    if demand.kind is DemandKind.MIG:
        slices = max(p.compute_slices for _, ps in demand.mig_options for p in ps)
        return gpu_equivalent(1, mig_slices=slices)
    if demand.kind is DemandKind.SHARE:
        return _share_gpus(machine, demand, min)
    return least_use(machine, demand)[0]


def _counted(machine: Machine, demand: Demand) -> str:
    """How a share's GPUs were counted, for messages: ' (60 GiB of an 80 GiB GPU; a share counts …)'."""
    if demand.kind is not DemandKind.SHARE or not demand.memory_bytes:
        return ""
    size = max(machine.gpus[g].memory_bytes for g in demand.eligible)
    return (
        f" ({format_size(demand.memory_bytes)} of a GPU of {format_size(size)} and "
        f"{demand.milli / MILLI_PER_GPU * 100:g}% of its compute: a share counts the larger fraction)"
    )


@dataclass(frozen=True, slots=True)
class QuotaShort:
    """A quota a job can never meet: the API field it is about, what the job needs, what the quota is."""

    field: str  # "gpus" or "gpu_memory_bytes"
    need: str  # "0.75 GPUs (60 GiB of an 80 GiB GPU …)"
    quota: str  # "0.5 GPUs", "50 GiB GPU memory"


def never_fits(quota: TenantQuota | None, machine: Machine, demand: Demand) -> QuotaShort | None:
    """The quota even an idle tenant could never hold the job under, or None."""
    if quota is None:
        return None
    gpus, memory = least_use(machine, demand)
    if quota.max_gpus is not None and gpus > quota.max_gpus + 1e-9:
        return QuotaShort("gpus", f"{gpus:.3g} GPUs{_counted(machine, demand)}", f"{quota.max_gpus:g} GPUs")
    if quota.max_gpu_memory_bytes is not None and memory > quota.max_gpu_memory_bytes:
        limit = f"{format_size(quota.max_gpu_memory_bytes)} GPU memory"
        return QuotaShort("gpu_memory_bytes", f"{format_size(memory)} of GPU memory", limit)
    return None


def check_fits_quota(quota: TenantQuota | None, tenant: str, machine: Machine, demand: Demand) -> None:
    """QuotaNeverFits when even an idle tenant could never hold the job (at submit)."""
    short = never_fits(quota, machine, demand)
    if short is not None:
        raise QuotaNeverFits(
            f"{short.field}: the job needs {short.need} but tenant {tenant}'s quota is {short.quota}; "
            f"raise the quota (gpuslice tenants set {tenant} …) or ask for less"
        )


def quota_reason(
    quota: TenantQuota | None,
    tenant: str,
    machine: Machine,
    held: Iterable[Holding],
    gpus: float,
    memory: int,
) -> PendingReason | None:
    """Why the tenant (holding ``held``) cannot take ``gpus`` and ``memory`` more now; None if it can."""
    if quota is None:
        return None
    held = list(held)
    used_gpus = sum(held_gpus(machine, h) for h in held)
    if quota.max_gpus is not None and used_gpus + gpus > quota.max_gpus + 1e-9:
        return PendingReason(
            Refusal(RefusalCode.QUOTA, 0, need=gpus, free=quota.max_gpus - used_gpus,
                    capacity=quota.max_gpus, unit=Unit.GPUS),
            f"tenant {tenant} at its quota of {quota.max_gpus:g} GPUs "
            f"({used_gpus:.3g} in use, this job needs {gpus:.3g})",
        )  # fmt: skip
    used_memory = sum(memory_of(machine, h) for h in held)
    if quota.max_gpu_memory_bytes is not None and used_memory + memory > quota.max_gpu_memory_bytes:
        return PendingReason(
            Refusal(RefusalCode.QUOTA, 0, need=memory, free=quota.max_gpu_memory_bytes - used_memory,
                    capacity=quota.max_gpu_memory_bytes, unit=Unit.GPU_MEMORY),
            f"tenant {tenant} at its quota of {format_size(quota.max_gpu_memory_bytes)} GPU memory "
            f"({format_size(used_memory)} in use, this job needs {format_size(memory)})",
        )  # fmt: skip
    return None


def tenant_usage(machine: Machine, running: Iterable[tuple[str, Holding]]) -> dict[str, tuple[float, int]]:
    """Per tenant: the GPUs (``held_gpus``) and GPU memory (``memory_of``) of its running holdings."""
    usage: dict[str, tuple[float, int]] = {}
    for tenant, h in running:
        gpus, memory = usage.get(tenant, (0.0, 0))
        usage[tenant] = (gpus + held_gpus(machine, h), memory + memory_of(machine, h))
    return usage


def never_reason(
    quota: TenantQuota | None, tenant: str, machine: Machine, demand: Demand
) -> PendingReason | None:
    """A waiting job's reason when its tenant's quota (lowered since it was accepted) can never admit it.
    It stays queued, visibly, until the quota is raised or someone cancels it; nothing cancels it
    behind the user's back."""
    short = never_fits(quota, machine, demand)
    if short is None:
        return None
    return PendingReason.of(
        RefusalCode.QUOTA,
        f"can never run under quota {short.quota} of tenant {tenant}: it needs {short.need}; raise the "
        f"quota (gpuslice tenants set {tenant} …) or cancel it",
    )

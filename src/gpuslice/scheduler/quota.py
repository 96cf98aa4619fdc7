"""Tenant quotas on one machine: how much of it a job holds (GPUs counted as fractions for shares and MIG
instances), the least it could hold wherever it goes, and whether a tenant has room for it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuslice.errors import InvalidRequest
from gpuslice.hardware.machine import Machine
from gpuslice.scheduler.node_fit import Demand, DemandKind, Holding, gpus_equivalent
from gpuslice.scheduler.reasons import PendingCode, PendingReason
from gpuslice.units import format_size
from gpuslice.workload.request import MILLI_PER_GPU

__all__ = ["TenantQuota", "check_fits_quota", "least_use", "memory_of", "memory_on", "quota_reason"]


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


def least_use(machine: Machine, demand: Demand) -> tuple[float, int]:
    """The fewest GPUs and least GPU memory the job can hold, wherever it goes (for quotas)."""
    if demand.kind is DemandKind.NONE:
        return 0.0, 0
    if demand.kind is DemandKind.MIG:
        profiles = [p for _, ps in demand.mig_options for p in ps]
        return min(p.compute_slices for p in profiles) / 7, min(p.memory_bytes for p in profiles)
    if demand.kind is DemandKind.SHARE:
        return demand.milli / MILLI_PER_GPU, demand.memory_bytes
    smallest = sorted(machine.gpus[g].memory_bytes for g in demand.eligible)
    return float(demand.count), sum(smallest[: demand.count])


def check_fits_quota(quota: TenantQuota | None, tenant: str, machine: Machine, demand: Demand) -> None:
    """InvalidRequest when even an idle tenant could never hold the job (at submit)."""
    if quota is None:
        return
    gpus, memory = least_use(machine, demand)
    if quota.max_gpus is not None and gpus > quota.max_gpus + 1e-9:
        raise InvalidRequest(
            f"gpus: the job needs {gpus:g} GPUs but tenant {tenant}'s quota is {quota.max_gpus:g}"
        )
    if quota.max_gpu_memory_bytes is not None and memory > quota.max_gpu_memory_bytes:
        raise InvalidRequest(
            f"gpu_memory_bytes: the job needs {format_size(memory)} of GPU memory but tenant "
            f"{tenant}'s quota is {format_size(quota.max_gpu_memory_bytes)}"
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
    used_gpus = sum(gpus_equivalent(h) for h in held)
    if quota.max_gpus is not None and used_gpus + gpus > quota.max_gpus + 1e-9:
        return PendingReason(
            PendingCode.QUOTA,
            f"tenant {tenant} at its quota of {quota.max_gpus:g} GPUs "
            f"({used_gpus:g} in use, this job needs {gpus:g})",
        )
    used_memory = sum(memory_of(machine, h) for h in held)
    if quota.max_gpu_memory_bytes is not None and used_memory + memory > quota.max_gpu_memory_bytes:
        return PendingReason(
            PendingCode.QUOTA,
            f"tenant {tenant} at its quota of {format_size(quota.max_gpu_memory_bytes)} GPU memory "
            f"({format_size(used_memory)} in use, this job needs {format_size(memory)})",
        )
    return None

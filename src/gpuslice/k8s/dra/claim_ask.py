"""What one ResourceClaim asks gpuslice for, read from its spec: the claims the DRA allocator decides
(gpuslice's shared or whole-GPU class, one request, no selector, no config; at most one matchAttribute)
and their GPU count, memory and cores; the memory as the request policy rounds it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuslice.k8s import quantity
from gpuslice.k8s.dra.classes import CLASS_SHARED, CLASS_WHOLE
from gpuslice.k8s.dra.slices import CAPACITY_CORES, CAPACITY_MEMORY, MEMORY_MIN_MIB, MEMORY_STEP_MIB

__all__ = ["ClaimAsk", "aligned_mib", "claim_ask"]


@dataclass(frozen=True, slots=True)
class ClaimAsk:
    """What one claim asks gpuslice for: ``count`` GPUs, each ``memory_mib`` (0: all) and ``cores`` %."""

    request: str
    count: int
    memory_mib: int
    cores: int
    exclusive: bool
    match_attribute: str = ""


def claim_ask(claim: Mapping[str, Any]) -> ClaimAsk | None:
    """The claim as a gpuslice request, or None when gpuslice does not decide it (see module doc);
    InvalidRequest when its capacity request is not a quantity gpuslice can allocate (``k8s.quantity``)."""
    devices = (claim.get("spec") or {}).get("devices") or {}
    requests = devices.get("requests") or []
    if len(requests) != 1 or devices.get("config"):
        return None
    exactly = requests[0].get("exactly")
    if (
        not exactly
        or exactly.get("deviceClassName") not in (CLASS_SHARED, CLASS_WHOLE)
        or exactly.get("selectors")
    ):
        return None
    if exactly.get("allocationMode", "ExactCount") != "ExactCount" or exactly.get("adminAccess"):
        return None
    asked = (exactly.get("capacity") or {}).get("requests") or {}
    if set(asked) - {CAPACITY_MEMORY, CAPACITY_CORES}:
        return None
    where = f"request {requests[0].get('name')}: capacity"
    memory, cores = 0, 100  # no memory asked: all of it; no cores: the whole GPU's
    if CAPACITY_MEMORY in asked:
        memory = quantity.bytes_as_mib(asked[CAPACITY_MEMORY], f"{where} {CAPACITY_MEMORY}")
    if CAPACITY_CORES in asked:
        cores = quantity.whole_count(asked[CAPACITY_CORES], f"{where} {CAPACITY_CORES}")
    attribute = ""
    for constraint in devices.get("constraints") or []:
        if constraint.get("distinctAttribute") or attribute:
            return None
        attribute = str(constraint.get("matchAttribute") or "")
    exclusive = exactly["deviceClassName"] == CLASS_WHOLE
    return ClaimAsk(
        str(requests[0]["name"]),
        int(exactly.get("count", 1)),
        memory,
        cores,
        exclusive,
        attribute,
    )


def aligned_mib(mib: int) -> int:
    """Memory as the request policy rounds it: up to 256 MiB steps from 256 MiB."""
    if mib <= MEMORY_MIN_MIB:
        return MEMORY_MIN_MIB
    return MEMORY_MIN_MIB + -(-(mib - MEMORY_MIN_MIB) // MEMORY_STEP_MIB) * MEMORY_STEP_MIB

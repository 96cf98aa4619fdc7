"""The gpuslice policy API: everything a policy file may import from gpuslice, in one module.

A policy program (``gpuslice policy check FILE``) imports only from an allow-list (``math``, ``numpy``,
``collections``, ``heapq``, ``dataclasses``, a few ``typing`` names) and from this module. It re-exports
the three ops bases (placement, queue, memory), the read-only views and request types their hooks
receive, the memory decision contexts and codes, the helpers the built-in policies use, and ``Map``,
the only state a policy declares. Nothing here reads files, the clock or the environment.

The memory names are looked up when first used (``__getattr__`` below), so a placement or queue policy
file, and every openb replay, runs without loading the memory engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpuslice.hardware.node import MAX_GPUS_PER_NODE
from gpuslice.ledger.fragmentation import FragmentationMeasure
from gpuslice.ledger.ledger import LedgerView
from gpuslice.ledger.placement import Placement
from gpuslice.policies.base import (
    MAX_NODE_SCORE,
    MAX_SPEC_CPU_MILLI,
    MAX_SPEC_GPU_MILLI,
    PlacementOps,
    PolicyContext,
    TieBreak,
    best_fit_gpus,
    lowest_free_gpus,
)
from gpuslice.policies.queue.base import QueuedJob, QueueOps, QueueView
from gpuslice.programs.maps import Map
from gpuslice.workload.job import JobSpec, Priority
from gpuslice.workload.request import MILLI_PER_GPU, Request

if TYPE_CHECKING:
    from gpuslice.memory.hooks import (
        BYPASS,
        DEFAULT,
        ENTER_LOOP,
        EVICT_MOVES_MAX,
        HEAD,
        PRIORITY_HIGH,
        PRIORITY_LOW,
        PRIORITY_OTHER,
        TAIL,
        UNUSED,
        USED,
        DecisionContext,
        EvictContext,
        MemoryOps,
        MemoryView,
        PrefetchFault,
    )

__all__ = [
    "BYPASS",
    "DEFAULT",
    "ENTER_LOOP",
    "EVICT_MOVES_MAX",
    "HEAD",
    "MAX_GPUS_PER_NODE",
    "MAX_NODE_SCORE",
    "MAX_SPEC_CPU_MILLI",
    "MAX_SPEC_GPU_MILLI",
    "MILLI_PER_GPU",
    "PRIORITY_HIGH",
    "PRIORITY_LOW",
    "PRIORITY_OTHER",
    "TAIL",
    "UNUSED",
    "USED",
    "DecisionContext",
    "EvictContext",
    "FragmentationMeasure",
    "JobSpec",
    "LedgerView",
    "Map",
    "MemoryOps",
    "MemoryView",
    "Placement",
    "PlacementOps",
    "PolicyContext",
    "PrefetchFault",
    "Priority",
    "QueueOps",
    "QueueView",
    "QueuedJob",
    "Request",
    "TieBreak",
    "best_fit_gpus",
    "lowest_free_gpus",
]

# What __all__ names but this module has not imported: the memory names, resolved on first use by
# __getattr__ below (imported above only for type checkers).
_MEMORY_NAMES = frozenset(name for name in __all__ if name not in globals())


def __getattr__(name: str) -> Any:
    """The memory names, imported from ``gpuslice.memory.hooks`` on first use (PEP 562)."""
    if name in _MEMORY_NAMES:
        value = getattr(importlib.import_module("gpuslice.memory.hooks"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _MEMORY_NAMES)

"""Driver default eviction: LRU by activation over 2 MB chunks (the UVM driver's, ``uvm_pmm_gpu.c``).

Victims come from a free chunk, else the head of ``unused``, else the head of ``used``; a chunk moves to
the used tail only when it is activated (allocated or migrated into), so under dense access it behaves
like "least recently migrated-in", close to FIFO. Every hook is the base class's: this file is the name.
Weakness: a cyclic sweep larger than the GPU misses on every chunk (the classic LRU loop pathology).
"""

from __future__ import annotations

from gpuslice.memory.hooks import MemoryOps

__all__ = ["DriverDefault"]


class DriverDefault(MemoryOps):
    name = "default"
    summary = "driver LRU at activation (free → unused head → used head)"
    kind = "evict"

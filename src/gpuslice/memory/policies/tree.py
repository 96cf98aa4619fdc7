"""Driver tree prefetcher: the native 51 % density tree (the UVM driver's
``uvm_perf_prefetch.c``, after Ganguly et al., IPDPS 2020).

Per faulted page, grown to its 64 KB big page, the largest bitmap-tree node with
``counter * 100 > pages * 51`` is migrated; the region never leaves the 2 MB block, and thrashing blocks
get no prefetch. With the GPU as preferred location a first-touch fault takes the whole block. Every hook
is the base class's: the simulator runs the native tree vectorised.
"""

from __future__ import annotations

from gpuslice.memory.hooks import MemoryOps

__all__ = ["DriverTree"]


class DriverTree(MemoryOps):
    name = "tree"
    summary = "driver 51 % tree prefetcher, 64 KB growth, never crossing a block"
    kind = "prefetch"

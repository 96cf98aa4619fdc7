"""FIFO eviction (gpu_ext ``eviction_fifo.bpf.c``).

Activation keeps the native tail move; the access hook returns BYPASS, so a chunk never moves on use and
the list is in order of last activation. Suits sequential streaming (fewer list operations). With
driver-faithful visibility the access hook never fires and FIFO equals the driver default.
"""

from __future__ import annotations

from gpuslice.memory.hooks import BYPASS, DecisionContext, MemoryOps, MemoryView

__all__ = ["Fifo"]


class Fifo(MemoryOps):
    name = "fifo"
    summary = "order of activation; accesses never move a chunk"
    kind = "evict"

    def block_access(self, view: MemoryView, block: int, hits: int, ctx: DecisionContext) -> int:
        return BYPASS

"""No prefetch (gpu_ext ``prefetch_none.bpf.c``): request the empty region with BYPASS,
so only the faulted pages move — pure demand paging."""

from __future__ import annotations

from gpuslice.memory.hooks import BYPASS, DecisionContext, MemoryOps, MemoryView, PrefetchFault

__all__ = ["PrefetchNone"]


class PrefetchNone(MemoryOps):
    name = "none"
    summary = "demand paging: only faulted pages move"
    kind = "prefetch"

    def page_prefetch(self, view: MemoryView, fault: PrefetchFault, ctx: DecisionContext) -> int:
        ctx.set_prefetch_region(0, 0)
        return BYPASS

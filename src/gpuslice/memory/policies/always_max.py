"""Always-max prefetch (gpu_ext ``prefetch_always_max.bpf.c``).

Every fault requests the whole ``max_prefetch_region`` (the 2 MB block) with BYPASS. The authors call it
"the most basic and most effective" policy: on rand_stream at 1.2× it cut 1805.7 ms to 1162.0 ms. Unlike
the native tree it is not switched off for thrashing blocks.
"""

from __future__ import annotations

from gpuslice.memory.hooks import BYPASS, DecisionContext, MemoryOps, MemoryView, PrefetchFault

__all__ = ["AlwaysMax"]


class AlwaysMax(MemoryOps):
    name = "always-max"
    summary = "whole 2 MB block on every fault"
    kind = "prefetch"

    def page_prefetch(self, view: MemoryView, fault: PrefetchFault, ctx: DecisionContext) -> int:
        ctx.set_prefetch_region(fault.max_first, fault.max_outer)
        return BYPASS

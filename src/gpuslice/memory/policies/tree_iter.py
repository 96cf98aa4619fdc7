"""Tree-iterator threshold prefetch (gpu_ext ``prefetch_adaptive_tree_iter.bpf.c``).

The first hook returns ENTER_LOOP with an empty region; at every tree level the iterator commits the
node when ``counter * 100 > pages * threshold`` — the native rule with a variable threshold (BPF default
51; the loader's adaptive mode maps throughput onto 0–100, not modelled: pass ``threshold``). Last commit
(the largest node) wins.
"""

from __future__ import annotations

from gpuslice.memory.hooks import ENTER_LOOP, DecisionContext, MemoryOps, MemoryView, PrefetchFault

__all__ = ["TreeIter"]

THRESHOLD = 51  # BPF default


class TreeIter(MemoryOps):
    name = "tree-iter"
    summary = "native tree walked by the policy, threshold 51 %"
    kind = "prefetch"

    def __init__(self, threshold: int = THRESHOLD) -> None:
        self.default_threshold = threshold

    def threshold(self, view: MemoryView, fault: PrefetchFault) -> int:
        return self.default_threshold

    def page_prefetch(self, view: MemoryView, fault: PrefetchFault, ctx: DecisionContext) -> int:
        ctx.set_prefetch_region(0, 0)
        return ENTER_LOOP

    def page_prefetch_iter(
        self,
        view: MemoryView,
        fault: PrefetchFault,
        first: int,
        outer: int,
        counter: int,
        ctx: DecisionContext,
    ) -> int:
        if counter * 100 > (outer - first) * self.threshold(view, fault):
            ctx.set_prefetch_region(first, outer)
            return 1
        return 0

"""Approximate 2Q / two-hit segmented LRU (gpu_ext ``eviction_2q_approx``).

A chunk seen in only one residency episode is on probation at the HEAD; once it has been seen in two distinct
episodes (it came back after an eviction, or an access was observed after its activation) it is promoted to
the TAIL. Only head/tail moves exist, so the two queues share one list and the ghost queue has no size
(gpu_ext ``extension/README.md`` says so): this is the approximation gpu_ext ships. Episodes end at
evict-prepare, when the chunk is at the head.
"""

from __future__ import annotations

from gpuslice.memory.hooks import (
    BYPASS,
    HEAD,
    TAIL,
    UNUSED,
    USED,
    DecisionContext,
    EvictContext,
    MemoryOps,
    MemoryView,
)

__all__ = ["TwoQ"]


class TwoQ(MemoryOps):
    name = "2q"
    summary = "probation at head until seen in 2 residency episodes, then tail"
    kind = "evict"

    def __init__(self) -> None:
        self.episodes: dict[int, int] = {}  # finished residency episodes per block
        self.seen: set[int] = set()  # blocks with an access observed in the current episode

    def block_activate(self, view: MemoryView, block: int, ctx: DecisionContext) -> None:
        promoted = self.episodes.get(block, 0) >= 1 or block in self.seen
        ctx.request_reorder(USED, TAIL if promoted else HEAD)

    def block_access(self, view: MemoryView, block: int, hits: int, ctx: DecisionContext) -> int:
        self.seen.add(block)
        ctx.request_reorder(USED, TAIL)
        return BYPASS

    def evict_prepare(self, view: MemoryView, ctx: EvictContext) -> None:
        for head in view.head(UNUSED, 1) or view.head(USED, 1):
            self.episodes[head] = self.episodes.get(head, 0) + 1
            self.seen.discard(head)

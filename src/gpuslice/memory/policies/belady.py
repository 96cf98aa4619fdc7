"""Belady's MIN: evict the chunk whose next use is farthest in the future — the offline optimum for
chunk misses, and the bound every eviction policy is measured against (Belady, "A study of
replacement algorithms for a virtual-storage computer", IBM Systems Journal, 1966).

Offline: ``init`` reads the whole trace. Keys are next-use positions; a key computed at an earlier batch
stays exact until the trace passes it (the block was used in between), so evict-prepare first refreshes
every passed key (a min-heap pops them), then takes the largest live key (a max-heap) and moves that chunk
to the head of ``unused``, where the driver takes its victim. Each refresh passes one access of the trace,
so the whole run costs O(n log n): a stable argsort, and a heap operation plus a binary search per refresh.

It is the bound for chunk faults. Page faults also depend on how many pages of a chunk were resident, so
with a partial-block prefetcher another policy can occasionally need fewer page faults.
"""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from gpuslice.memory.hooks import HEAD, UNUSED, DecisionContext, EvictContext, MemoryOps, MemoryView

__all__ = ["Belady"]


class Belady(MemoryOps):
    name = "belady"
    summary = "offline MIN: evict the chunk used farthest in the future (the bound)"
    kind = "evict"

    def init(self, view: MemoryView) -> None:
        blocks = np.asarray(view.trace_blocks)
        order = np.argsort(blocks, kind="stable")  # positions grouped by block, increasing inside a group
        # plain lists: one binary search per activation, where bisect beats numpy's per-call overhead
        self.positions = order.tolist()
        self.offsets = np.searchsorted(blocks[order], np.arange(len(view.owner) + 1)).tolist()
        self.never = len(blocks)
        self.key: dict[int, int] = {}
        self.min_heap: list[tuple[int, int]] = []
        self.max_heap: list[tuple[int, int]] = []

    def next_use(self, block: int, now: int) -> int:
        hi = self.offsets[block + 1]
        i = bisect.bisect_left(self.positions, now, self.offsets[block], hi)
        return self.positions[i] if i < hi else self.never

    def _set(self, block: int, key: int) -> None:
        self.key[block] = key
        heapq.heappush(self.min_heap, (key, block))
        heapq.heappush(self.max_heap, (-key, block))

    def block_activate(self, view: MemoryView, block: int, ctx: DecisionContext) -> None:
        self._set(block, self.next_use(block, view.position))

    def evict_prepare(self, view: MemoryView, ctx: EvictContext) -> None:
        now = view.position
        while self.min_heap and self.min_heap[0][0] < now:
            key, block = heapq.heappop(self.min_heap)
            if self.key.get(block) == key and view.list_of(block):
                self._set(block, self.next_use(block, now))
        while self.max_heap:
            key, block = -self.max_heap[0][0], self.max_heap[0][1]
            if self.key.get(block) == key and view.list_of(block):
                del self.key[block]
                heapq.heappop(self.max_heap)
                ctx.move(block, UNUSED, HEAD)
                return
            heapq.heappop(self.max_heap)

"""Refault protect: keep chunks that came back after being evicted; new chunks are evicted first.

A chunk activated for the first time goes to the HEAD of the used list (evicted first, scan-resistant
like LFU); a chunk whose block has been activated before — it was evicted and faulted back — goes to the
TAIL (evicted last), so a working set that keeps returning stays resident while one-off blocks stream
through. The activation counts are kept in a bounded Map: once it is full, blocks it has never seen are
treated as new (HEAD) instead of being added.
Where it works well: a hot working set mixed with a large one-pass scan.
Weakness: a scan that repeats (a cyclic sweep larger than the GPU) looks "hot" after one pass and
then behaves like the driver's LRU.
"""

from __future__ import annotations

from gpuslice.programs.api import HEAD, TAIL, USED, DecisionContext, Map, MemoryOps, MemoryView

MAX_BLOCKS = 65536  # one entry per VA block seen; gpu_ext's HASH maps hold 4096–100 000


class RefaultProtect(MemoryOps):
    name = "refault-protect"
    summary = "first activation at head; blocks that return after eviction at tail"
    kind = "evict"

    activations = Map(key=int, value=int, max_entries=MAX_BLOCKS)  # VA block -> times activated

    def block_activate(self, view: MemoryView, block: int, ctx: DecisionContext) -> None:
        seen = self.activations.get(block, 0)
        if seen or len(self.activations) < MAX_BLOCKS:
            self.activations.update(block, seen + 1)
        ctx.request_reorder(USED, TAIL if seen else HEAD)

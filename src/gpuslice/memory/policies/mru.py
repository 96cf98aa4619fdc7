"""Two MRU evictions: gpu_ext's variant (``mru``, gpu_ext ``eviction_mru.bpf.c``) and the textbook one.

``mru`` is gpu_ext's: activation requests TAIL (a new chunk gets time to be used); an access requests
HEAD, so the most recently *used* chunk is evicted first. A chunk moves to the head only on a hit, so
with driver-faithful visibility (the access hook never fires) only the activation half runs: new chunks
queue at the tail, the oldest activation is evicted first, and on a cyclic sweep it faults exactly like
FIFO (and the driver default), not like textbook MRU.

``mru-textbook`` is MRU as the caching literature defines it: the most recently referenced chunk is
evicted first. Activation is a reference too, so a new chunk goes to the HEAD as well as a used one.
On a cyclic sweep larger than the GPU it keeps the sweep's first chunks resident and faults only on
the rest, the case MRU exists for.
"""

from __future__ import annotations

from gpuslice.memory.hooks import BYPASS, HEAD, TAIL, USED, DecisionContext, MemoryOps, MemoryView

__all__ = ["Mru", "MruTextbook"]


class Mru(MemoryOps):
    name = "mru"
    summary = "gpu_ext's MRU: new chunk at tail, moved to the head (evicted first) only on a hit"
    kind = "evict"

    def block_activate(self, view: MemoryView, block: int, ctx: DecisionContext) -> None:
        ctx.request_reorder(USED, TAIL)

    def block_access(self, view: MemoryView, block: int, hits: int, ctx: DecisionContext) -> int:
        ctx.request_reorder(USED, HEAD)
        return BYPASS


class MruTextbook(MemoryOps):
    name = "mru-textbook"
    summary = "textbook MRU: every new or used chunk goes to the head (evicted first)"
    kind = "evict"

    def block_activate(self, view: MemoryView, block: int, ctx: DecisionContext) -> None:
        ctx.request_reorder(USED, HEAD)

    def block_access(self, view: MemoryView, block: int, hits: int, ctx: DecisionContext) -> int:
        ctx.request_reorder(USED, HEAD)
        return BYPASS

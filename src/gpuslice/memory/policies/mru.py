"""MRU eviction (gpu_ext ``eviction_mru.bpf.c``, research §2.1).

Activation requests TAIL (a new chunk gets time to be used); an access requests HEAD, so the most
recently used chunk is evicted first. Meant for single-pass scans and MoE prefill. With driver-faithful
visibility only the activation half runs, which is the driver default.
"""

from __future__ import annotations

from gpuslice.memory.hooks import BYPASS, HEAD, TAIL, USED, DecisionContext, MemoryOps, MemoryView

__all__ = ["Mru"]


class Mru(MemoryOps):
    name = "mru"
    summary = "new chunk at tail; a used chunk goes to the head (evicted first)"
    kind = "evict"

    def block_activate(self, view: MemoryView, block: int, ctx: DecisionContext) -> None:
        ctx.request_reorder(USED, TAIL)

    def block_access(self, view: MemoryView, block: int, hits: int, ctx: DecisionContext) -> int:
        ctx.request_reorder(USED, HEAD)
        return BYPASS

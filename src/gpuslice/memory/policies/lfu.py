"""Approximate LFU eviction (gpu_ext ``eviction_lfu.bpf.c``).

Activation sets the chunk's frequency to 1 and requests HEAD, so a new chunk is the easiest to evict;
every access event raises the frequency (capped at 255) and requests TAIL. Only head/tail moves exist,
so low frequencies sit near the head and order inside one frequency is LRU-like. With driver-faithful
visibility the access hook never fires and LFU degenerates to "newly activated chunk at head", which is
scan-resistant: a cyclic sweep larger than the GPU keeps a fixed resident subset instead of missing on
every chunk.
"""

from __future__ import annotations

from gpuslice.memory.hooks import BYPASS, HEAD, TAIL, USED, DecisionContext, MemoryOps, MemoryView

__all__ = ["Lfu"]

FREQ_MAX = 255  # frequency cap of the BPF map values (eviction_lfu.bpf.c)


class Lfu(MemoryOps):
    name = "lfu"
    summary = "new chunk at head; each access event → freq+1 (≤255) and tail"
    kind = "evict"

    def __init__(self) -> None:
        self.freq: dict[int, int] = {}

    def block_activate(self, view: MemoryView, block: int, ctx: DecisionContext) -> None:
        self.freq[block] = 1
        ctx.request_reorder(USED, HEAD)

    def block_access(self, view: MemoryView, block: int, hits: int, ctx: DecisionContext) -> int:
        old = self.freq.get(block, 1)
        self.freq[block] = min(FREQ_MAX, old + 1)
        if self.freq[block] > old:
            ctx.request_reorder(USED, TAIL)
        return BYPASS

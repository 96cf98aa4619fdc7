"""Approximate LFU eviction as a policy file (gpu_ext ``eviction_lfu.bpf.c``, research note §2.1).

Activation sets the chunk's frequency to 1 and requests HEAD (a new chunk is the easiest to evict); each
access event raises the frequency, capped at 255, and requests TAIL. The frequencies live in a Map, as
gpu_ext keeps them in a BPF HASH map; its bound is far above any workload's block count here, so the
file decides exactly as the built-in ``memory/policies/lfu.py``.
"""

from __future__ import annotations

from gpuslice.programs.api import BYPASS, HEAD, TAIL, USED, DecisionContext, Map, MemoryOps, MemoryView

FREQ_MAX = 255  # frequency cap of the BPF map values (research §2.1)


class Lfu(MemoryOps):
    name = "lfu"
    summary = "new chunk at head; each access event → freq+1 (≤255) and tail"
    kind = "evict"

    freq = Map(key=int, value=int, max_entries=1048576)  # VA block -> access frequency

    def block_activate(self, view: MemoryView, block: int, ctx: DecisionContext) -> None:
        self.freq.update(block, 1)
        ctx.request_reorder(USED, HEAD)

    def block_access(self, view: MemoryView, block: int, hits: int, ctx: DecisionContext) -> int:
        old = self.freq.get(block, 1)
        new = min(FREQ_MAX, old + 1)
        self.freq.update(block, new)
        if new > old:
            ctx.request_reorder(USED, TAIL)
        return BYPASS

"""Frequency-decay eviction (gpu_ext ``eviction_freq_pid_decay.bpf.c``).

Each access event bumps the chunk's counter; the chunk moves to TAIL only when ``counter % N == 0``, with
N from the owner's priority: high 1 (every access protects), low 10, others 5. Always BYPASS, so chunks
that are not due stay put. Evict-prepare forgets the head chunk (the next victim). The effect is a
probabilistic LRU whose protection is weakened per tenant. Needs "full" visibility to do anything.
"""

from __future__ import annotations

from gpuslice.memory.hooks import (
    BYPASS,
    PRIORITY_HIGH,
    PRIORITY_LOW,
    TAIL,
    UNUSED,
    USED,
    DecisionContext,
    EvictContext,
    MemoryOps,
    MemoryView,
)

__all__ = ["FreqDecay"]

DECAY_N = {PRIORITY_HIGH: 1, PRIORITY_LOW: 10}  # the BPF program's defaults
DECAY_N_OTHER = 5


class FreqDecay(MemoryOps):
    name = "freq-decay"
    summary = "tail on every N-th access; N = 1 high, 10 low, 5 others"
    kind = "evict"

    def __init__(self) -> None:
        self.count: dict[int, int] = {}

    def period(self, view: MemoryView, block: int) -> int:
        return DECAY_N.get(view.priority(int(view.owner[block])), DECAY_N_OTHER)

    def block_access(self, view: MemoryView, block: int, hits: int, ctx: DecisionContext) -> int:
        self.count[block] = self.count.get(block, 0) + 1
        if self.count[block] % self.period(view, block) == 0:
            ctx.request_reorder(USED, TAIL)
        return BYPASS

    def evict_prepare(self, view: MemoryView, ctx: EvictContext) -> None:
        for head in view.head(UNUSED, 1) or view.head(USED, 1):
            self.count.pop(head, None)

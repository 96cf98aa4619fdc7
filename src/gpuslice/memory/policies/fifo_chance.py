"""FIFO with per-tenant second chances (gpu_ext ``eviction_fifo_chance.bpf.c``).

Activation gives a chunk chances from its owner's priority: high 3, low 0 (pure FIFO), others 1. An
access resets them (BYPASS: no move). Evict-prepare looks at up to 8 head chunks: one with chances left
loses one and goes to the tail; the first with none stays as the victim. Needs v0/v1 list moves in
evict-prepare, which our evict context allows (see hooks.py).
"""

from __future__ import annotations

from gpuslice.memory.hooks import (
    BYPASS,
    EVICT_MOVES_MAX,
    PRIORITY_HIGH,
    PRIORITY_LOW,
    TAIL,
    USED,
    DecisionContext,
    EvictContext,
    MemoryOps,
    MemoryView,
)

__all__ = ["FifoChance"]

CHANCES = {PRIORITY_HIGH: 3, PRIORITY_LOW: 0}  # the BPF program's defaults
CHANCES_OTHER = 1


class FifoChance(MemoryOps):
    name = "fifo-chance"
    summary = "FIFO; head chunks with chances left (3 high, 0 low, 1 other) go round again"
    kind = "evict"

    def __init__(self) -> None:
        self.chances: dict[int, int] = {}

    def initial(self, view: MemoryView, block: int) -> int:
        return CHANCES.get(view.priority(int(view.owner[block])), CHANCES_OTHER)

    def block_activate(self, view: MemoryView, block: int, ctx: DecisionContext) -> None:
        self.chances[block] = self.initial(view, block)

    def block_access(self, view: MemoryView, block: int, hits: int, ctx: DecisionContext) -> int:
        self.chances[block] = self.initial(view, block)
        return BYPASS

    def evict_prepare(self, view: MemoryView, ctx: EvictContext) -> None:
        for block in view.head(USED, EVICT_MOVES_MAX):
            left = self.chances.get(block, 0)
            if left == 0:
                self.chances.pop(block, None)  # the victim: dropped from tracking
                return
            self.chances[block] = left - 1
            ctx.move(block, USED, TAIL)

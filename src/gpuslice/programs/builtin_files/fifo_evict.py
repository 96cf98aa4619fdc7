"""FIFO eviction as a policy file (gpu_ext ``eviction_fifo.bpf.c``, research note §2.1).

Activation keeps the driver's tail move; the access hook returns BYPASS, so a chunk never moves on use and
the list stays in order of activation. The built-in ``memory/policies/fifo.py``, against the policy API.
"""

from __future__ import annotations

from gpuslice.programs.api import BYPASS, DecisionContext, MemoryOps, MemoryView


class Fifo(MemoryOps):
    name = "fifo"
    summary = "order of activation; accesses never move a chunk"
    kind = "evict"

    def block_access(self, view: MemoryView, block: int, hits: int, ctx: DecisionContext) -> int:
        return BYPASS

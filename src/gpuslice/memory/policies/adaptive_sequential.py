"""Adaptive sequential prefetch (gpu_ext ``prefetch_adaptive_sequential.bpf.c`` + loader).

Prefetch ``pct`` % of the block forward from the faulting page, ``[page+1, page+1+n)`` clamped to the
block, always BYPASS. The loader re-reads link throughput once a second and sets
``pct = min + (max − min) × throughput / max_bw`` with min 30 %, max 100 %, max_bw 20 480 MB/s; before the
first update (no map value) pct is 100 %. Here throughput is the simulated link traffic over the last
second of simulated time; runs shorter than a second never leave 100 %.
"""

from __future__ import annotations

from gpuslice.memory.hooks import BYPASS, DecisionContext, MemoryOps, MemoryView, PrefetchFault
from gpuslice.units import MiB

__all__ = ["AdaptiveSequential"]

PCT_MIN, PCT_MAX = 30, 100  # loader defaults
MAX_BW = 20_480 * MiB  # bytes/s, the loader's max_bw
PERIOD_S = 1.0  # the loader updates once a second


class AdaptiveSequential(MemoryOps):
    name = "adaptive-seq"
    summary = "forward pct % of the block; pct 30–100 % follows link throughput (100 % until measured)"
    kind = "prefetch"

    def __init__(self, pct: int | None = None) -> None:
        self.fixed = pct
        self.pct = PCT_MAX if pct is None else pct
        self.last_s = 0.0
        self.last_bytes = 0

    def page_prefetch(self, view: MemoryView, fault: PrefetchFault, ctx: DecisionContext) -> int:
        if self.fixed is None and view.now_s - self.last_s >= PERIOD_S:
            throughput = (view.moved_bytes - self.last_bytes) / (view.now_s - self.last_s)
            self.pct = round(PCT_MIN + (PCT_MAX - PCT_MIN) * min(1.0, throughput / MAX_BW))
            self.last_s, self.last_bytes = view.now_s, view.moved_bytes
        n = fault.max_outer * self.pct // 100
        first = min(fault.page_index + 1, fault.max_outer)
        outer = min(first + n, fault.max_outer)
        ctx.set_prefetch_region(first, outer) if outer > first else ctx.set_prefetch_region(0, 0)
        return BYPASS

"""Stride prefetch as a policy file (gpu_ext ``prefetch_stride.bpf.c``, research note §2.2).

Per VA block: last page, stride and confidence, in three Maps (gpu_ext keeps one HASH map of block state).
delta = page − last: 0 does nothing; |delta| > 128 decays the confidence; delta equal to the stride raises
it, otherwise it decays (never below 0) and the stride is replaced. At confidence ≥ 2 it prefetches 2
pages at page + stride, clamped to the block, with BYPASS; otherwise the empty region with BYPASS. The
built-in ``memory/policies/stride.py``, against the policy API; the maps' bound is far above any
workload's block count here, so both decide alike.
"""

from __future__ import annotations

from gpuslice.programs.api import BYPASS, DecisionContext, Map, MemoryOps, MemoryView, PrefetchFault

CONFIDENCE, PAGES, MAX_STRIDE = 2, 2, 128  # loader defaults -t -n -m (research §2.2)


class Stride(MemoryOps):
    name = "stride"
    summary = "per-block stride detector: 2 pages at page+stride once seen twice"
    kind = "prefetch"

    last = Map(key=int, value=int, max_entries=1048576)  # block -> last faulted page
    stride = Map(key=int, value=int, max_entries=1048576)  # block -> current stride
    confidence = Map(key=int, value=int, max_entries=1048576)  # block -> confidence ≥ 0

    def page_prefetch(self, view: MemoryView, fault: PrefetchFault, ctx: DecisionContext) -> int:
        page, block = fault.page_index, fault.block
        last = self.last.get(block)
        if last is None:
            self.last.update(block, page)
            self.stride.update(block, 0)
            self.confidence.update(block, 0)
            ctx.set_prefetch_region(0, 0)
            return BYPASS
        stride, confidence = self.stride.get(block), self.confidence.get(block)
        delta = page - last
        if delta != 0:
            if abs(delta) > MAX_STRIDE:
                confidence = max(0, confidence - 1)
            elif delta == stride:
                confidence += 1
            else:
                confidence = max(0, confidence - 1)
                stride = delta
            self.last.update(block, page)
            self.stride.update(block, stride)
            self.confidence.update(block, confidence)
        if confidence >= CONFIDENCE and stride != 0:
            target = page + stride
            first, outer = (target, target + PAGES) if stride > 0 else (target - PAGES + 1, target + 1)
            first, outer = max(first, fault.max_first), min(outer, fault.max_outer)
            if first < outer:
                ctx.set_prefetch_region(first, outer)
                return BYPASS
        ctx.set_prefetch_region(0, 0)
        return BYPASS

"""Stride prefetch (gpu_ext ``prefetch_stride.bpf.c``).

Per VA block: last page, stride and a confidence. At each fault, delta = page − last: 0 does nothing;
|delta| > 128 decays the confidence; delta equal to the stride raises it, otherwise it decays and the
stride is replaced. A decay never takes the confidence below 0 (the field is signed, but the BPF source,
``gpu_ext:extension/prefetch_stride.bpf.c``, decrements only when it is > 0), so a block whose stride
settles needs exactly two matching deltas, whatever came before. At confidence ≥ 2 it prefetches 2 pages
at page + stride (forward windows start there, backward ones end there), clamped to the block, with
BYPASS; otherwise it requests the empty region with BYPASS (the first fault in a block never
prefetches, and a fault without a confident stride moves only its own 4 KB page — no 64 KB growth, no
tree). gpu_ext pairs it with LFU for llama.cpp MoE decode.
"""

from __future__ import annotations

from gpuslice.memory.hooks import BYPASS, DecisionContext, MemoryOps, MemoryView, PrefetchFault

__all__ = ["Stride"]

CONFIDENCE, PAGES, MAX_STRIDE = 2, 2, 128  # loader defaults -t -n -m


class Stride(MemoryOps):
    name = "stride"
    summary = "per-block stride detector: 2 pages at page+stride once seen twice"
    kind = "prefetch"

    def __init__(self) -> None:
        self.state: dict[int, list[int]] = {}  # block -> [last, stride, confidence]

    def page_prefetch(self, view: MemoryView, fault: PrefetchFault, ctx: DecisionContext) -> int:
        page = fault.page_index
        st = self.state.get(fault.block)
        if st is None:
            self.state[fault.block] = [page, 0, 0]
            ctx.set_prefetch_region(0, 0)
            return BYPASS
        delta = page - st[0]
        if delta != 0:
            if abs(delta) > MAX_STRIDE:
                st[2] = max(0, st[2] - 1)
            elif delta == st[1]:
                st[2] += 1
            else:
                st[2] = max(0, st[2] - 1)
                st[1] = delta
            st[0] = page
        if st[2] >= CONFIDENCE and st[1] != 0:
            target = page + st[1]
            first, outer = (target, target + PAGES) if st[1] > 0 else (target - PAGES + 1, target + 1)
            first, outer = max(first, fault.max_first), min(outer, fault.max_outer)
            if first < outer:
                ctx.set_prefetch_region(first, outer)
                return BYPASS
        ctx.set_prefetch_region(0, 0)
        return BYPASS

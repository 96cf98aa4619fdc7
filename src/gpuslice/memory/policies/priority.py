"""Per-tenant priority, prefetch and eviction in one ops table (gpu_ext ``prefetch_eviction_pid.bpf.c``)
— the policy behind the gpu_ext paper's two-tenant co-location result.

One priority value p per tenant drives both halves: prefetch is the tree rule with threshold p %, eviction
is frequency decay with N = max(1, p / 10). Defaults: high p = 10 (threshold 10 %, N = 1), low p = 80
(80 %, N = 8), others 50 (50 %, N = 5). With driver-faithful visibility only the prefetch half acts,
matching gpu_ext's note that eviction adds < 1 % over prefetch alone (gpu_ext
``docs/eval/multi-tenant-memory/EVALUATION_REPORT.md``).
"""

from __future__ import annotations

from gpuslice.memory.hooks import PRIORITY_HIGH, PRIORITY_LOW, MemoryView, PrefetchFault
from gpuslice.memory.policies.freq_decay import FreqDecay
from gpuslice.memory.policies.tree_iter import TreeIter

__all__ = ["Priority"]

P = {PRIORITY_HIGH: 10, PRIORITY_LOW: 80}  # the BPF program's defaults
P_OTHER = 50


class Priority(TreeIter, FreqDecay):
    name = "priority"
    summary = "per-tenant p: tree threshold p % and decay N = max(1, p/10); p 10 high, 80 low, 50 other"
    kind = "both"

    def __init__(self) -> None:
        TreeIter.__init__(self)
        FreqDecay.__init__(self)

    def _p(self, view: MemoryView, tenant: int) -> int:
        return P.get(view.priority(tenant), P_OTHER)

    def threshold(self, view: MemoryView, fault: PrefetchFault) -> int:
        return self._p(view, fault.tenant)

    def period(self, view: MemoryView, block: int) -> int:
        return max(1, self._p(view, int(view.owner[block])) // 10)
